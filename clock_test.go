package ratelimit_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

func TestCoarseClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := ratelimit.NewCoarseClock(10 * time.Millisecond)
		start := c.Now()
		require.Equal(t, time.Now().UnixMilli(), start.UnixMilli())
		time.Sleep(5 * time.Millisecond)
		require.Equal(t, start, c.Now(), "no tick yet")
		time.Sleep(10 * time.Millisecond)
		require.Equal(t, start.Add(10*time.Millisecond), c.Now())
		c.Stop()
		c.Stop()
		time.Sleep(time.Second)
		require.Equal(t, start.Add(10*time.Millisecond), c.Now(), "a stopped clock keeps its last tick")
	})
}
