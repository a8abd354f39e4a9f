package store

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// The sketch never says a key was looked up less often than it was (up to
// its ceiling), and halving fades what is old.
func TestSketch(t *testing.T) {
	s := newSketch(1000)
	rnd := rand.New(rand.NewPCG(1, 2))
	counts := map[uint64]int{}
	for range 5000 { // below the halving point (10 × 1000 lookups)
		h := rnd.Uint64N(1000) * 0x9E3779B97F4A7C15 // as many keys as it is sized for
		counts[h]++
		s.add(h)
	}
	over := 0
	for h, n := range counts {
		e := int(s.estimate(h))
		if e < min(n, sketchMax) {
			t.Fatalf("estimate %d below the %d lookups", e, n)
		}
		if e > n {
			over++
		}
	}
	if over > len(counts)/10 {
		t.Fatalf("%d of %d keys overestimated", over, len(counts))
	}
	mix := uint64(0x9E3779B97F4A7C15)
	hot := 12345 * mix
	for range sketchMax {
		s.add(hot)
	}
	before := s.estimate(hot)
	for i := range 10_000 { // past the halving point
		s.add(uint64(i+100_000) * 0xC2B2AE3D27D4EB4F)
	}
	if after := s.estimate(hot); after >= before {
		t.Fatalf("a key not looked up again kept its estimate %d (was %d) across a halving", after, before)
	}
}

// A shard is two cache lines, so that cores locking neighbouring shards do
// not share one.
func TestShardSize(t *testing.T) {
	if n := unsafe.Sizeof(shard{}); n != 128 {
		t.Fatalf("shard is %d bytes, want 128: adjust its padding", n)
	}
}
