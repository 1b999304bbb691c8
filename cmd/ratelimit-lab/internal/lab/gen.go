package lab

import (
	"container/heap"
	"math"
	"math/rand/v2"
)

// keyRates returns each key's mean rate in hits/s: all equal to rate for the
// uniform distribution; for Zipf, key i's share is proportional to
// 1/(i+1)^s, scaled so the mean stays rate.
func keyRates(keys int, rate float64, dist string, s float64) []float64 {
	r := make([]float64, keys)
	if dist != "zipf" {
		for i := range r {
			r[i] = rate
		}
		return r
	}
	var sum float64
	for i := range r {
		r[i] = math.Pow(float64(i+1), -s)
		sum += r[i]
	}
	for i := range r {
		r[i] *= rate * float64(keys) / sum
	}
	return r
}

// arrival is one key's next hit in an arrivals queue.
type arrival struct {
	t   int64 // ns from the run's start
	n   int64 // hits so far (even spacing: t = phase + n*gap, with no drift)
	key uint32
}

// arrivals merges the hit streams of a set of keys in time order. Each key
// hits evenly (every 1/rate, from a random phase) or as a Poisson process.
type arrivals struct {
	q       arrivalHeap
	gap     []float64 // per key, ns between hits
	phase   []float64
	poisson bool
	rng     *rand.Rand
}

func newArrivals(keys []uint32, rates []float64, poisson bool, rng *rand.Rand) *arrivals {
	a := &arrivals{poisson: poisson, rng: rng, gap: make([]float64, len(rates)), phase: make([]float64, len(rates))}
	for _, k := range keys {
		if rates[k] <= 0 {
			continue
		}
		a.gap[k] = 1e9 / rates[k]
		var t float64
		if poisson {
			t = rng.ExpFloat64() * a.gap[k]
		} else {
			a.phase[k] = rng.Float64() * a.gap[k]
			t = a.phase[k]
		}
		a.q = append(a.q, arrival{t: int64(t), key: k})
	}
	heap.Init(&a.q)
	return a
}

// next returns the next hit's time (ns from the start) and key; ok is false
// when no key has a positive rate.
func (a *arrivals) next() (t int64, key uint32, ok bool) {
	if len(a.q) == 0 {
		return 0, 0, false
	}
	h := &a.q[0]
	t, key = h.t, h.key
	h.n++
	if a.poisson {
		h.t += max(1, int64(a.rng.ExpFloat64()*a.gap[key]))
	} else {
		h.t = max(h.t+1, int64(a.phase[key]+float64(h.n)*a.gap[key]))
	}
	heap.Fix(&a.q, 0)
	return t, key, true
}

type arrivalHeap []arrival

func (h arrivalHeap) Len() int { return len(h) }
func (h arrivalHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].key < h[j].key
}
func (h arrivalHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *arrivalHeap) Push(x any)   { *h = append(*h, x.(arrival)) }
func (h *arrivalHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// balancer picks the node for a hit. Round-robin rotates per key: a key's
// successive hits go to successive nodes, so every key's traffic is spread
// evenly. (One global rotation would pin a key to one node whenever evenly
// spaced keys come round in a period that is a multiple of the node count.)
type balancer struct {
	policy string
	nodes  int
	rr     []int32 // per key: the node its next hit goes to
	rng    *rand.Rand
}

func newBalancer(policy string, nodes, keys int, rng *rand.Rand) *balancer {
	b := &balancer{policy: policy, nodes: nodes, rng: rng}
	if policy == "round-robin" {
		b.rr = make([]int32, keys)
		for k := range b.rr {
			b.rr[k] = int32(k % nodes) // keys start on different nodes
		}
	}
	return b
}

func (b *balancer) pick(key uint32) int {
	switch b.policy {
	case "random":
		return b.rng.IntN(b.nodes)
	case "hash":
		h := uint64(key)*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
		h ^= h >> 29
		return int(h % uint64(b.nodes))
	}
	n := b.rr[key]
	b.rr[key] = (n + 1) % int32(b.nodes)
	return int(n)
}
