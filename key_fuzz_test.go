package ratelimit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratesync/ratelimit"
)

// FuzzKeys feeds arbitrary keys, values and windows to a namespace: no panic,
// errors are sentinels, and a key's counts add up (hashed long keys included).
func FuzzKeys(f *testing.F) {
	f.Add("alice", int64(1), int64(1000))
	f.Add("", int64(1), int64(1000))
	f.Add("a\x00\xff\xfe", int64(-3), int64(60000))
	f.Add(string(make([]byte, 300)), int64(1<<53), int64(0))
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, SyncRate: -1,
		Clock: func() time.Time { return time.UnixMilli(1_700_000_040_000) }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key string, value, windowMS int64) {
		window := time.Duration(windowMS) * time.Millisecond
		before, err := ns.SlidingWindow(ctx, key, window)
		if err != nil {
			if !errors.Is(err, ratelimit.ErrInvalidKey) && !errors.Is(err, ratelimit.ErrUnknownWindow) {
				t.Fatalf("SlidingWindow(%q, %v): unexpected error %v", key, window, err)
			}
			return
		}
		after, err := ns.Increment(ctx, key, window, value)
		if err != nil {
			if !errors.Is(err, ratelimit.ErrInvalidValue) {
				t.Fatalf("Increment(%q, %v, %d): unexpected error %v", key, window, value, err)
			}
			return
		}
		if value > 1<<40 || value < -(1<<40) {
			return // floats lose exactness here; no panic and no error is the check
		}
		if after != before+float64(value) {
			t.Fatalf("Increment(%q, %d): rate %v, want %v", key, value, after, before+float64(value))
		}
	})
}
