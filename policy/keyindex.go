package policy

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"math/bits"
)

// keyIndex maps the exact keys of the lists and overrides to their flags and
// override entry. Resolve looks every request's key up in it, and a policy
// may hold 100,000 overrides, so it is laid out for the memory it touches
// rather than built on a map:
//
//   - a blocked Bloom filter (12 bits per key, one cache line per key) says
//     "absent" for almost every key that is not listed, from 150 KB for
//     100,000 keys, small enough to stay in the CPU's cache;
//   - an open-addressed table of 8-byte slots (a hash tag and an offset,
//     load at most 1/2) holds the rest;
//   - each key's record (flags, entry, length, bytes) is contiguous in one
//     arena, so a listed key costs one slot line and one record line.
//
// The hash of a key is computed once for the filter and the table. A
// keyIndex is built by add and read-only afterwards.
type keyIndex struct {
	seed   maphash.Seed
	filter []uint64 // filterWords words per block
	blocks uint64
	slots  []uint64 // tag<<32 | offset+1; 0 is empty
	mask   uint64
	arena  []byte // records: flags, entry+1 (uint32), length (uint32), key
	n      int
	full   bool // a key did not fit: the arena's offsets are 32-bit
}

const (
	filterWords = 8  // one 64-byte cache line per block; one bit per word
	filterBits  = 12 // bits per key: a false positive rate near 0.5%
	recHeader   = 9
)

// salts spread a hash over the filter block's words (from the split-block
// Bloom filter of Apache Parquet).
var salts = [filterWords]uint32{0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31}

// newKeyIndex returns an empty index sized for at most n keys.
func newKeyIndex(n int) *keyIndex {
	x := &keyIndex{seed: maphash.MakeSeed()}
	if n == 0 {
		return x
	}
	x.blocks = uint64(max((n*filterBits+filterWords*64-1)/(filterWords*64), 1))
	x.filter = make([]uint64, x.blocks*filterWords)
	size := uint64(1) << bits.Len(uint(2*n-1)) // a power of two, at least 2n
	x.slots = make([]uint64, size)
	x.mask = size - 1
	x.arena = make([]byte, 0, n*(recHeader+16)) // keys of 16 bytes or so
	return x
}

// block returns the filter block of hash h; word i of the block holds the
// key's bit bit(h, i).
func (x *keyIndex) block(h uint64) *[filterWords]uint64 {
	b := (h >> 32) * x.blocks >> 32 // the high half, mapped onto the blocks
	return (*[filterWords]uint64)(x.filter[b*filterWords:])
}

func bit(h uint64, i int) uint64 { return 1 << (uint32(h) * salts[i] >> 26) }

// record returns the offset of key's record, or -1.
func (x *keyIndex) record(key string, h uint64) int {
	tag := h >> 32
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		s := x.slots[i]
		if s == 0 {
			return -1
		}
		if s>>32 == tag {
			off := int(uint32(s)) - 1
			a := x.arena[off:]
			n := int(binary.LittleEndian.Uint32(a[5:]))
			if string(a[recHeader:recHeader+n]) == key {
				return off
			}
		}
	}
}

// add records flags and, when entry >= 0, the override entry (an index into
// Snapshot.entries) for key, adding the key if it is new. At most the n
// keys newKeyIndex was given may be added. It reports whether the key had
// an override entry already.
func (x *keyIndex) add(key string, flags uint8, entry int) bool {
	return x.addHashed(key, x.hash(key), flags, entry)
}

// addHashed is add for a key of hash h.
func (x *keyIndex) addHashed(key string, h uint64, flags uint8, entry int) bool {
	off := x.record(key, h)
	if off < 0 {
		if len(x.arena)+recHeader+len(key) >= math.MaxUint32 {
			x.full = true
			return false
		}
		off = len(x.arena)
		x.arena = binary.LittleEndian.AppendUint32(append(x.arena, 0), 0)
		x.arena = binary.LittleEndian.AppendUint32(x.arena, uint32(len(key)))
		x.arena = append(x.arena, key...)
		i := h & x.mask
		for x.slots[i] != 0 {
			i = (i + 1) & x.mask
		}
		x.slots[i] = h>>32<<32 | uint64(off+1)
		blk := x.block(h)
		for j := range blk {
			blk[j] |= bit(h, j)
		}
		x.n++
	}
	x.arena[off] |= flags
	had := binary.LittleEndian.Uint32(x.arena[off+1:]) != 0
	if entry >= 0 {
		binary.LittleEndian.PutUint32(x.arena[off+1:], uint32(entry+1))
	}
	return had && entry >= 0
}

func (x *keyIndex) hash(key string) uint64 { return maphash.String(x.seed, key) }

// mayHold reports whether the filter lets a key of hash h through: false
// means the key is surely absent.
func (x *keyIndex) mayHold(h uint64) bool {
	blk := x.block(h)
	for j := range blk {
		if blk[j]&bit(h, j) == 0 {
			return false
		}
	}
	return true
}

// get returns key's flags and override entry (-1 for none).
func (x *keyIndex) get(key string) (uint8, int) {
	if x.n == 0 {
		return 0, -1
	}
	return x.getHashed(key, x.hash(key))
}

// getHashed is get for a key of hash h.
func (x *keyIndex) getHashed(key string, h uint64) (uint8, int) {
	if !x.mayHold(h) {
		return 0, -1
	}
	off := x.record(key, h)
	if off < 0 {
		return 0, -1
	}
	return x.arena[off], int(binary.LittleEndian.Uint32(x.arena[off+1:])) - 1
}
