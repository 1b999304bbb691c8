package ratefields

import (
	"time"

	"github.com/ratesync/ratelimit"
)

// MaxInteger is the largest structured-field integer (RFC 9651: 15 digits).
// Larger quotas and counts are sent as MaxInteger.
const MaxInteger = 999_999_999_999_999

// Quota returns a limit's quota and window as the IETF fields express them:
// Max per Window; for a token bucket, its Burst per the time the Burst takes
// to refill (Burst × Window / Max), so that q per w is both the most a client
// may send at once and the steady rate. httplimit and grpclimit advertise
// limits so.
func Quota(l ratelimit.Limit) (int64, time.Duration) {
	if l.Algorithm != ratelimit.TokenBucket {
		return l.Max, l.Window
	}
	b := l.Burst
	if b == 0 {
		b = l.Max
	}
	return b, time.Duration(float64(l.Window) * float64(b) / float64(l.Max))
}

// CeilSeconds is d in whole seconds, rounded up; 0 when d is not positive.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// WindowSeconds is a window in whole seconds, rounded up, at least 1: the
// w parameter has no finer unit.
func WindowSeconds(d time.Duration) int64 {
	return max(CeilSeconds(d), 1)
}
