package ratelimit

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSystemClockFollowsTimeNow(t *testing.T) {
	c := newSystemClock()
	for range 1000 {
		before := time.Now().UnixMilli()
		got := c.unixMilli()
		after := time.Now().UnixMilli()
		require.GreaterOrEqual(t, got, before)
		require.LessOrEqual(t, got, after)
	}
}

func TestSystemClockReanchors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSystemClock()
		require.Equal(t, time.Now().UnixMilli(), c.unixMilli())
		time.Sleep(1500 * time.Microsecond)
		require.Equal(t, time.Now().UnixMilli(), c.unixMilli())

		// The wall clock steps 5 s back under the anchor: the step shows
		// once the anchor is a second old, as it would through time.Now.
		c.offset.Add(int64(5 * time.Second))
		require.Equal(t, time.Now().UnixMilli()+5000, c.unixMilli())
		time.Sleep(time.Second)
		require.Equal(t, time.Now().UnixMilli(), c.unixMilli())

		// A monotonic reading behind the anchor takes a new anchor at once.
		c.anchor.Add(int64(time.Hour))
		c.offset.Add(int64(time.Hour))
		require.Equal(t, time.Now().UnixMilli(), c.unixMilli())
	})
}

func TestFloorDiv(t *testing.T) {
	require.Equal(t, int64(2), floorDiv(2999, 1000))
	require.Equal(t, int64(-1), floorDiv(-1, 1000))
	require.Equal(t, int64(-1), floorDiv(-1000, 1000))
	require.Equal(t, int64(-2), floorDiv(-1001, 1000))
}
