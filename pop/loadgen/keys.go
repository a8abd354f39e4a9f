package loadgen

import (
	"math"
	"math/bits"
	"sync/atomic"
)

// exactKeysMax is the largest key space whose distinct values sent are
// counted exactly, one bit a value: 2^27 values, a 16 MiB bitmap. Larger
// ones are estimated.
const exactKeysMax = 1 << 27

// hllBits is log2 of the HyperLogLog's registers: 2^14, a standard error
// of 1.04/√2^14 ≈ 0.8%.
const hllBits = 14

// keySet counts the distinct values a run sends (by their indexes, see
// drawer), shared by the run's workers: exactly in a bitmap when the key
// space is at most exactKeysMax, otherwise as a HyperLogLog estimate. It is
// safe for concurrent use; adding a value already seen writes nothing.
type keySet struct {
	bits []atomic.Uint64 // exact; nil when estimating
	hll  []atomic.Uint32 // registers; nil when exact
}

func newKeySet(space uint64) *keySet {
	if space <= exactKeysMax {
		return &keySet{bits: make([]atomic.Uint64, (space+63)/64)}
	}
	return &keySet{hll: make([]atomic.Uint32, 1<<hllBits)}
}

// add counts value i as sent.
func (s *keySet) add(i uint64) {
	if s.bits != nil {
		w, m := &s.bits[i/64], uint64(1)<<(i%64)
		if w.Load()&m == 0 {
			w.Or(m)
		}
		return
	}
	h := mix64(i)
	r := &s.hll[h>>(64-hllBits)]
	rank := uint32(bits.LeadingZeros64(h<<hllBits|1<<(hllBits-1))) + 1
	for {
		old := r.Load()
		if rank <= old || r.CompareAndSwap(old, rank) {
			return
		}
	}
}

// count returns how many distinct values were added, and whether that is
// exact rather than an estimate.
func (s *keySet) count() (n int64, exact bool) {
	if s.bits != nil {
		for i := range s.bits {
			n += int64(bits.OnesCount64(s.bits[i].Load()))
		}
		return n, true
	}
	const m = float64(1 << hllBits)
	sum, zeros := 0.0, 0
	for i := range s.hll {
		r := s.hll[i].Load()
		sum += math.Ldexp(1, -int(r))
		if r == 0 {
			zeros++
		}
	}
	est := 0.7213 / (1 + 1.079/m) * m * m / sum
	if est <= 2.5*m && zeros > 0 { // small range: linear counting
		est = m * math.Log(m/float64(zeros))
	}
	return int64(math.Round(est)), false
}

// mix64 is SplitMix64's finalizer: it spreads consecutive indexes over all
// 64 bits, as the HyperLogLog needs.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
