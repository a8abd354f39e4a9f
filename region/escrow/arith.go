package escrow

import (
	"math"
	"math/bits"
)

// mulDiv returns ⌊a·b/c⌋ computed on 128 bits, saturating at
// math.MaxUint64. It requires c > 0.
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, c)
	return q
}

// mulDivCeil returns ⌈a·b/c⌉ computed on 128 bits, saturating at
// math.MaxUint64. It requires c > 0.
func mulDivCeil(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, r := bits.Div64(hi, lo, c)
	if r != 0 && q < math.MaxUint64 {
		q++
	}
	return q
}

// addSat returns a+b, or math.MaxUint64 if the sum overflows.
func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// subSat returns a−b, or 0 if b > a.
func subSat(a, b uint64) uint64 {
	if b >= a {
		return 0
	}
	return a - b
}

// windowStart returns the start of the epoch-aligned window of length w
// (w > 0) that holds t.
func windowStart(t, w int64) int64 {
	r := t % w
	if r < 0 {
		r += w
	}
	return t - r
}
