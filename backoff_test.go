package ratelimit

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoff(t *testing.T) {
	for _, c := range []struct {
		interval, limit time.Duration
		failures        int
		lo, hi          time.Duration
	}{
		{100 * time.Millisecond, 5 * time.Second, 1, 100 * time.Millisecond, 200 * time.Millisecond},
		{100 * time.Millisecond, 5 * time.Second, 3, 400 * time.Millisecond, 800 * time.Millisecond},
		{100 * time.Millisecond, 5 * time.Second, 1000, 2500 * time.Millisecond, 5 * time.Second},
		// A RetryInterval above MaxBackoff: never faster than the interval,
		// and no overflow after many failures (this panicked once).
		{time.Hour, 5 * time.Second, 1, 30 * time.Minute, time.Hour},
		{time.Hour, 5 * time.Second, 40, 30 * time.Minute, time.Hour},
		{time.Duration(math.MaxInt64 / 3), time.Duration(math.MaxInt64), 70, time.Duration(math.MaxInt64 / 2), time.Duration(math.MaxInt64)},
	} {
		for range 100 {
			d := backoff(c.interval, c.limit, c.failures)
			require.GreaterOrEqual(t, d, c.lo, "%+v", c)
			require.LessOrEqual(t, d, c.hi, "%+v", c)
		}
	}
}
