package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// Redis Cluster failover under traffic: 3 masters and 3 replicas
// (cluster-node-timeout 1 s), 4 nodes (3 asynchronous, 1 synchronous) counting
// on 200 keys spread over 16 shards through ClusterClients with go-redis's
// default retries and redirects. A replica takes over its master with
// CLUSTER FAILOVER (graceful: the replica catches up first), or the master is
// killed with SIGKILL and its replica promoted after the node timeout, then
// restarted to rejoin as a replica. No hit is counted twice; a graceful
// failover loses none; a kill loses at most the writes the master
// acknowledged and did not pass on; every node drains within 5 cycles; no
// call outlives its bound.
func TestClusterFailover(t *testing.T) {
	noLeaks(t)
	rounds := pick(2, 1)
	for _, kill := range []bool{false, true} {
		name := "graceful"
		if kill {
			name = "sigkill"
		}
		t.Run(name, func(t *testing.T) {
			rc := startCluster(t, 3)
			opts := redis.Options{KeyPrefix: "topo", Shards: 16}
			var nodes []strategy.Strategy
			for range 4 {
				s, err := redis.New(rc.client(), opts)
				require.NoError(t, err)
				nodes = append(nodes, s)
			}
			direct, err := redis.New(rc.client(), opts)
			require.NoError(t, err)
			c := newCounting(t, nodes, 1, 200)
			c.run()
			for round := range rounds {
				time.Sleep(time.Second) // traffic before the fault
				masters := rc.byRole("master")
				require.Len(t, masters, 3)
				victim := masters[round%3]
				replica := rc.replicaOf(victim)
				at := time.Now()
				if kill {
					victim.kill()
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					require.NoError(t, replica.client().Do(ctx, "cluster", "failover").Err())
					cancel()
				}
				require.True(t, pollUntil(30*time.Second, func() bool { return replica.role() == "master" }),
					"replica %s not promoted", replica.addr())
				promoted := time.Since(at)
				if kill {
					require.NoError(t, victim.start()) // rejoins as a replica of the promoted node
				}
				rc.waitHealthy(3, 45*time.Second)
				result(t, "round %d: %s of master %s, replica promoted in %v, cluster healthy after %v",
					round, name, victim.addr(), promoted.Round(time.Millisecond), time.Since(at).Round(time.Millisecond))
			}
			time.Sleep(time.Second) // traffic after the last fault
			o := c.finish(direct, 20*time.Second)
			result(t, "%d rounds: %s", rounds, o)
			o.check(t, 5)
			if !kill {
				require.Zero(t, o.lost, "a graceful failover lost hits: %s", o)
			}
		})
	}
}
