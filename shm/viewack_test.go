package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// TestViewDuringAck: a view taken while Ack settles a push of the same window
// must count the pushed hits at least once. Ack stores the store's total in
// synced and then takes the pushed hits out of local; a view that loads
// synced before the Ack and local after it counts them zero times, and a
// decision on that view admits past the limit (here: 5 hits confirmed, the
// 6th request sees 1 and a limit of 5 admits it).
func TestViewDuringAck(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true})
	const now = 1_000_000
	for range 5 {
		tb.Add("k", 0, now, 1)
	}
	var b Batch
	tb.collectAll(now, false, &b)
	require.Len(t, b.Diffs, 1)
	require.EqualValues(t, 5, b.Diffs[0].Delta)
	armed := true
	testHookView = func() {
		if armed {
			armed = false
			// The sync loop settles the push between the view's two loads.
			tb.Ack(&b, strategy.Result{Totals: []int64{5}})
		}
	}
	t.Cleanup(func() { testHookView = nil })
	v, _, _ := tb.AddOpen("k", 0, now, 1, false, false) // lock-free: its view holds no lock
	require.False(t, armed, "the hook ran")
	// Between Ack's two steps a view may count the pushed hits twice
	// (conservative), never zero times.
	require.GreaterOrEqual(t, v.Cur, int64(6), "5 confirmed hits and this one")
}
