package ratelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestSyncModeOutageIsExact: in synchronous mode the store decides token
// buckets and sliding logs. While it fails (refusing, losing requests, or
// applying them and losing the replies), the node answers from its own state
// and says so; once it is back, the store has counted exactly the requests
// the node admitted: none lost, none twice.
func TestSyncModeOutageIsExact(t *testing.T) {
	for _, fault := range []memory.Fault{memory.Refuse, memory.LoseRequest, memory.LoseReply} {
		t.Run(fmt.Sprint(fault), func(t *testing.T) {
			clk := newDecClock(decEpoch)
			ns, store := newDecNS(t, "sync", clk, time.Hour)
			ctx := context.Background()
			// No refill within the test: the bucket's TAT counts the spends.
			// 90 requests of cost 1 to 3 against 100: the last ones are
			// rejected, some of them while the node decides alone.
			bucket := tb(time.Hour, 1, 100) // one token per hour
			lg := slog(time.Hour, 100)
			admitted := map[string]int64{}
			for phase, faulty := range []bool{false, true, false} {
				if faulty {
					store.SetFaults(func(op memory.Op) memory.Fault {
						if op == memory.OpTake || op == memory.OpPush {
							return fault
						}
						return memory.NoFault
					})
				} else {
					store.SetFaults(nil)
				}
				for i := range 30 {
					for _, l := range []ratelimit.Limit{bucket, lg} {
						key := l.Algorithm.String()
						d, err := ns.Allow(ctx, key, 1+int64(i%3), l)
						require.NoError(t, err)
						// The circuit breaker rejects from memory, not degraded.
						require.Equal(t, faulty, d.Degraded || (faulty && !d.Allowed), "phase %d", phase)
						if d.Allowed {
							admitted[key] += 1 + int64(i%3)
						}
					}
				}
			}
			require.Less(t, admitted["token_bucket"], int64(180), "some were rejected")
			require.NoError(t, ns.Sync(ctx), "the retry loop settles what the outage left")
			res, err := store.Take(ctx, &strategy.Take{Namespace: ns.Name(), Key: "sliding_log", Now: decEpoch.UnixMilli(), Peek: true,
				Logs: []strategy.TakeLog{{Window: time.Hour, Max: 100}}})
			require.NoError(t, err)
			require.Equal(t, admitted["sliding_log"], res.Logs[0].Count, "the log holds every admitted request once")
			res, err = store.Take(ctx, &strategy.Take{Namespace: ns.Name(), Key: "token_bucket", Now: decEpoch.UnixMilli(), Peek: true,
				Buckets: []strategy.TakeBucket{{Period: time.Hour, Interval: 3_600_000, Burst: 100}}})
			require.NoError(t, err)
			require.Equal(t, float64(decEpoch.UnixMilli())+float64(admitted["token_bucket"])*3_600_000, res.Buckets[0].TAT,
				"the bucket spent every admitted request's tokens once")
		})
	}
}
