package policy

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestKeyIndexMatchesMap drives a keyIndex and a map with the same random
// keys and compares every answer, for keys present and absent: with the
// index's hash, and with a poor one under which many keys share a slot and
// a tag, so that only the keys' bytes tell them apart.
func TestKeyIndexMatchesMap(t *testing.T) {
	t.Run("maphash", func(t *testing.T) { testKeyIndex(t, (*keyIndex).hash) })
	t.Run("collisions", func(t *testing.T) {
		testKeyIndex(t, func(_ *keyIndex, k string) uint64 { return uint64(len(k)%3) * 0x9e3779b97f4a7c15 })
	})
}

func testKeyIndex(t *testing.T, hash func(*keyIndex, string) uint64) {
	type info struct {
		flags uint8
		entry int
	}
	for _, n := range []int{1, 7, 1000, 3000} {
		r := rand.New(rand.NewPCG(uint64(n), 1))
		key := func() string {
			switch r.IntN(3) {
			case 0:
				return "sk_" + strconv.Itoa(r.IntN(2*n+1))
			case 1:
				return string(rune('a' + r.IntN(26)))
			}
			return "key/" + strconv.Itoa(r.IntN(n+1)) + "/" + string(make([]byte, r.IntN(40)))
		}
		x := newKeyIndex(n)
		ref := map[string]info{}
		for range n {
			k := key()
			flags, entry := uint8(r.IntN(4)), r.IntN(5)-1
			if len(ref) == n {
				break
			}
			x.addHashed(k, hash(x, k), flags, entry)
			i, ok := ref[k]
			if !ok {
				i.entry = -1
			}
			i.flags |= flags
			if entry >= 0 {
				i.entry = entry
			}
			ref[k] = i
		}
		check := func(k string) {
			t.Helper()
			want, ok := ref[k]
			if !ok {
				want.entry = -1
			}
			flags, entry := x.getHashed(k, hash(x, k))
			if flags != want.flags || entry != want.entry {
				t.Fatalf("n=%d: get(%q) = %d, %d; want %d, %d", n, k, flags, entry, want.flags, want.entry)
			}
		}
		for k := range ref {
			check(k)
		}
		for range 10 * n {
			check(key())
		}
		check("")
	}
}

// TestKeyIndexFilter checks the filter's false positive rate is near its
// design (0.5%): absent keys must rarely reach the table.
func TestKeyIndexFilter(t *testing.T) {
	const n = 100_000
	x := newKeyIndex(n)
	for i := range n {
		x.add("sk_ovr_"+strconv.Itoa(i), 0, 0)
	}
	fp := 0
	for i := range n {
		h := x.hash("sk_plain_" + strconv.Itoa(i))
		if x.mayHold(h) {
			fp++
		}
	}
	rate := float64(fp) / n
	t.Logf("false positive rate %.5f", rate)
	if rate > 0.01 {
		t.Fatalf("false positive rate %.4f, want at most 0.01", rate)
	}
}
