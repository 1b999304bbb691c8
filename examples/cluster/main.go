// Command cluster simulates three nodes that share one in-process memory store:
// hits arrive round-robin, each node counts them in memory, and the background
// sync brings every node to the cluster-wide total. No server is needed.
//
//	go run ./examples/cluster
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

func main() {
	nodes := flag.Int("nodes", 3, "simulated nodes")
	hits := flag.Int("hits", 600, "hits to send, round-robin over the nodes")
	syncRate := flag.Duration("sync", 100*time.Millisecond, "SyncRate of every node")
	flag.Parse()
	if err := run(*nodes, *hits, *syncRate); err != nil {
		log.Fatal(err)
	}
}

func run(nodes, hits int, syncRate time.Duration) error {
	if nodes < 1 || hits < 4 {
		return fmt.Errorf("need at least 1 node and 4 hits, got -nodes %d -hits %d", nodes, hits)
	}
	ctx := context.Background()
	store := memory.New() // one store shared by every node: the "cluster"
	var spaces []*ratelimit.Namespace
	for range nodes {
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{
			Namespace:   "api",
			WindowSizes: []time.Duration{time.Minute},
			SyncRate:    syncRate,
			Strategy:    store,
		})
		if err != nil {
			return err
		}
		defer reg.Close(ctx)
		spaces = append(spaces, ns)
	}

	fmt.Printf("%d nodes, SyncRate %v, %d hits for key \"alice\" sent round-robin\n\n", nodes, syncRate, hits)
	report := func(label string) error {
		fmt.Printf("%-28s", label)
		for i, ns := range spaces {
			rate, err := ns.SlidingWindow(ctx, "alice", time.Minute)
			if err != nil {
				return err
			}
			fmt.Printf("  node%d=%6.1f", i+1, rate)
		}
		fmt.Println()
		return nil
	}
	for i := range hits {
		if _, err := spaces[i%nodes].Increment(ctx, "alice", time.Minute, 1); err != nil {
			return err
		}
		if (i+1)%(hits/4) == 0 {
			if err := report(fmt.Sprintf("after %d hits:", i+1)); err != nil {
				return err
			}
		}
		time.Sleep(time.Millisecond)
	}
	for c := 1; c <= 2; c++ {
		time.Sleep(syncRate)
		if err := report(fmt.Sprintf("after %d more sync cycle(s):", c)); err != nil {
			return err
		}
	}
	for i, ns := range spaces {
		rate, err := ns.SlidingWindow(ctx, "alice", time.Minute)
		if err != nil {
			return err
		}
		if rate != float64(hits) {
			// Near a minute boundary the sliding rate already weighs the
			// hits as the previous window's, so it is below the count.
			fmt.Printf("\nnode%d sees %.1f of %d hits (the window rolled over mid-demo)\n", i+1, rate, hits)
			return nil
		}
	}
	fmt.Printf("\nevery node sees the cluster-wide total of %d hits\n", hits)
	return nil
}
