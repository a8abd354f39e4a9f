package simulate

import "time"

// eventualBound is the overshoot the eventual mode is held to in a
// scenario, as a percentage of the limit: for each key, the most hits a
// PoP i that decides it cannot have heard of, max_i Σ_{j≠i} r_j·s_j over
// the PoPs its traffic reaches, where r_j is the most the key's sources may
// offer at j at once and s_j the longest j's news of an admission can take
// to reach another PoP — a flush interval, then the slowest one-way delay
// from j's region with its jitter. That is what i cannot know of when it
// decides, if nothing predicts it; each PoP admits at most a limit a
// window, so a key is never held to more than (m−1)·L with m PoPs. A key
// whose traffic reaches one PoP only is decided there on its own exact
// count: 0. The largest over the keys is returned.
//
// It assumes every message arrives: a lost delta adds a flush interval to
// its sender's span until the next one. During a cut the partition share
// decides instead, so scenarios with cuts are held to it only outside them.
func eventualBound(sc *Scenario, top *topology, srcs []source, nkeys int, limit int64) float64 {
	n := len(top.pops)
	span := make([]float64, n) // s_j, seconds
	for j := range n {
		var d int64
		for i := range n {
			if i != j {
				ri, rj := top.region[i], top.region[j]
				d = max(d, top.base[rj][ri]+top.jitter[rj][ri])
			}
		}
		span[j] = (time.Duration(sc.FlushInterval) + time.Duration(d)).Seconds()
	}
	// One source of a key at one PoP is exact there; spread over all, it
	// is a sum over all. Only keys of several sources need a table.
	nsrc := make([]int32, nkeys)
	for _, s := range srcs {
		nsrc[s.key]++
	}
	var worst float64
	hold := func(b float64, m int) { // b: the unheard hits at the worst-placed PoP
		if m >= 2 {
			worst = max(worst, min(b, float64(m-1)*float64(limit)))
		}
	}
	var sumSpan float64
	for _, s := range span {
		sumSpan += s
	}
	shared := map[int][]float64{} // r_j of the keys of several sources
	for _, s := range srcs {
		r := max(s.rate, s.rateEnd)
		if nsrc[s.key] == 1 {
			if s.spread != Anycast { // i misses all PoPs' shares but its own
				hold(r*(sumSpan-minOf(span))/float64(n), n)
			}
			continue
		}
		rj := shared[s.key]
		if rj == nil {
			rj = make([]float64, n)
			shared[s.key] = rj
		}
		if s.spread == Anycast {
			rj[s.pop] += r
			continue
		}
		for j := range n {
			rj[j] += r / float64(n)
		}
	}
	for _, rj := range shared {
		var sum, own float64 // Σ_j r_j·s_j, and the least r_i·s_i of a deciding PoP
		m := 0
		for j, r := range rj {
			if r > 0 {
				sum += r * span[j]
				if m == 0 || r*span[j] < own {
					own = r * span[j]
				}
				m++
			}
		}
		hold(sum-own, m)
	}
	return 100 * worst / float64(limit)
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs[1:] {
		m = min(m, x)
	}
	return m
}
