package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// histogram is an HDR-style log-linear latency histogram over nanoseconds.
// Values below 2^histSubBits are recorded exactly; above that every power of
// two is split into 2^(histSubBits-1) equal buckets, so a bucket's width is at
// most 1/64 of its lower bound and the reported midpoint is within ~0.8% of
// any value in it. Values up to 2^histMaxBits ns (~17 s) are tracked; larger
// ones land in the top bucket (max is still exact). The zero value is an
// empty histogram; it is not safe for concurrent use (one per worker, merged).
type histogram struct {
	counts [histBuckets]int64
	total  int64
	max    int64
}

const (
	histSubBits = 7
	histSub     = 1 << histSubBits // 128
	histHalf    = histSub / 2      // 64
	histMaxBits = 34
	histBuckets = histSub + (histMaxBits-histSubBits)*histHalf
)

func histIndex(v uint64) int {
	if v < histSub {
		return int(v)
	}
	if v >= 1<<histMaxBits {
		return histBuckets - 1
	}
	e := bits.Len64(v) - histSubBits // >= 1
	return histSub + (e-1)*histHalf + int(v>>uint(e)) - histHalf
}

// histMid returns the midpoint of bucket i's value range.
func histMid(i int) int64 {
	if i < histSub {
		return int64(i)
	}
	e := (i-histSub)/histHalf + 1
	m := int64((i-histSub)%histHalf + histHalf)
	lo := m << uint(e)
	return lo + (int64(1)<<uint(e))/2
}

func (h *histogram) record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[histIndex(uint64(v))]++
	h.total++
	if v > h.max {
		h.max = v
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	if o.max > h.max {
		h.max = o.max
	}
}

// quantile returns the value at quantile q in [0,1]: the midpoint of the
// bucket holding the ceil(q*total)-th smallest sample, capped at max.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.total)))
	if rank < 1 {
		rank = 1
	}
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			if i == histBuckets-1 { // open-ended top bucket
				return time.Duration(h.max)
			}
			return time.Duration(min(histMid(i), h.max))
		}
	}
	return time.Duration(h.max)
}
