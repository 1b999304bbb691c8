package ratefields_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/ratefields"
)

func TestQuota(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit ratelimit.Limit
		q     int64
		w     time.Duration
	}{
		{"window", ratelimit.Limit{Window: time.Minute, Max: 100}, 100, time.Minute},
		{"fixed window", ratelimit.Limit{Window: time.Hour, Max: 5, Fixed: true}, 5, time.Hour},
		{"token bucket: its burst per refill time", ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: time.Minute, Max: 100, Burst: 10}, 10, 6 * time.Second},
		{"token bucket without burst: Max", ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: time.Second, Max: 7}, 7, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, w := ratefields.Quota(tc.limit)
			require.Equal(t, tc.q, q)
			require.Equal(t, tc.w, w)
		})
	}
}

func TestSeconds(t *testing.T) {
	for _, tc := range []struct {
		d             time.Duration
		ceil, windows int64
	}{
		{-time.Second, 0, 1},
		{0, 0, 1},
		{time.Nanosecond, 1, 1},
		{time.Second, 1, 1},
		{time.Second + time.Nanosecond, 2, 2},
		{1500 * time.Millisecond, 2, 2},
		{time.Hour, 3600, 3600},
	} {
		require.Equal(t, tc.ceil, ratefields.CeilSeconds(tc.d), "CeilSeconds(%v)", tc.d)
		require.Equal(t, tc.windows, ratefields.WindowSeconds(tc.d), "WindowSeconds(%v)", tc.d)
	}
}
