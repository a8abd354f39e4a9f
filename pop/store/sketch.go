package store

// sketch estimates how often each key of a shard was looked up lately: a
// count-min sketch of small saturating counters, halved every resetEvery
// lookups so that old popularity fades (TinyLFU's frequency sketch). A full
// shard admits a new key only in place of a sampled key that is idle or
// looked up less often (shard.evict), so a flood of keys seen once each
// cannot push out a key that is counting — one at its limit above all — and
// a key that keeps coming back still earns its place.
//
// The zero value is empty and unusable; use newSketch. Not safe for
// concurrent use: its shard's mutex guards it.
type sketch struct {
	counts []uint8 // sketchMax at most; in blocks of one cache line
	shift  uint    // 64 − log2(number of blocks)
	adds   int     // lookups since the last halving
	reset  int     // halve after this many
}

const (
	sketchMax = 15
	// sketchWidthPerKey is counters per key the shard may hold: with four
	// counters a key, a new key's estimate is lifted by others' counts
	// rarely enough to lose to a key looked up twice.
	sketchWidthPerKey = 8
	// sketchBlock is the counters of one block, one cache line: a key's four
	// counters lie in one block, so a lookup costs one cache miss, not four.
	sketchBlock = 64
)

// newSketch returns a sketch for a shard of at most keys keys.
func newSketch(keys int) sketch {
	blocks, bits := 1, uint(0)
	for blocks*sketchBlock < keys*sketchWidthPerKey {
		blocks, bits = 2*blocks, bits+1
	}
	return sketch{counts: make([]uint8, blocks*sketchBlock), shift: 64 - bits, reset: 10 * keys}
}

// block returns the first counter of hash h's block. Every key of a shard
// shares the hash's top 8 bits, so the block is taken from the top bits of
// the hash times an odd constant, which mixes all of them in.
func (s *sketch) block(h uint64) uint64 {
	if s.shift == 64 {
		return 0
	}
	return ((h * 0x9E3779B97F4A7C15) >> s.shift) * sketchBlock
}

// index returns the i-th counter of hash h (0 ≤ i < 4) in its block, from
// six low bits of h each.
func index(block, h uint64, i int) uint64 {
	return block + (h>>(uint(i)*6))&(sketchBlock-1)
}

// add counts one lookup of hash h.
func (s *sketch) add(h uint64) {
	b := s.block(h)
	for i := range 4 {
		if j := index(b, h, i); s.counts[j] < sketchMax {
			s.counts[j]++
		}
	}
	if s.adds++; s.adds >= s.reset {
		for j := range s.counts {
			s.counts[j] >>= 1
		}
		s.adds = 0
	}
}

// estimate returns about how often hash h was looked up lately: never less
// than it was, more when other keys share all its counters.
func (s *sketch) estimate(h uint64) uint8 {
	b := s.block(h)
	m := uint8(sketchMax)
	for i := range 4 {
		m = min(m, s.counts[index(b, h, i)])
	}
	return m
}
