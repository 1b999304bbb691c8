package shm

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestOneKeyMatchesModel replays many short seeded histories of one key, with
// clock jumps both ways, against the model: deterministic, and small enough
// that a failure's trace reads at a glance.
func TestOneKeyMatchesModel(t *testing.T) {
	for seed := range uint64(5000) {
		rng := rand.New(rand.NewPCG(seed, 1))
		tb := newTable(t, Options{Sizes: []time.Duration{100 * time.Millisecond}})
		m := &model{sizes: []int64{100}, latest: map[[2]any]int64{}, count: map[[3]any]int64{}}
		now := int64(1_000_000)
		tb.Peek("k", 0, now)
		m.peek("k", 0, now)
		var trace []string
		for range 12 {
			if rng.IntN(3) == 0 {
				now -= int64(rng.IntN(400))
			} else {
				now += int64(rng.IntN(300))
			}
			v := int64(rng.IntN(9) + 1)
			peek := rng.IntN(3) == 0
			var got, want View
			if peek {
				got, want = tb.Peek("k", 0, now), m.peek("k", 0, now)
			} else {
				got, want = tb.Add("k", 0, now, v), m.add("k", 0, now, v)
			}
			trace = append(trace, fmt.Sprintf("peek=%v now=%d v=%d -> table %+v model %+v", peek, now, v, got, want))
			if got != want {
				for _, l := range trace {
					t.Log(l)
				}
				t.Fatal("diverged")
			}
		}
	}
}
