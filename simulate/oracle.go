package simulate

import (
	"slices"
	"time"
)

// oracle is the exact sliding-window log, kept per limit key, over the hits
// admitted at all PoPs: at any instant t it knows the true number of a key's
// hits admitted in (t − window, t], and the number offered (admitted or
// not). It grades each decision a strategy made and tracks overshoot. The
// zero value is not usable; use newOracle. An oracle is not safe for
// concurrent use.
//
// Decisions must be fed in non-decreasing time order.
//
// How a decision is graded, for a request of n hits on key k at t, with A the
// hits of k admitted in (t − window, t] and O those offered there (this
// request included):
//
//   - false allow: admitted although A + n > limit — an exact limiter would
//     have denied it; each one is a hit of overshoot.
//   - false deny: denied although A + n ≤ limit — an exact limiter in the
//     same state would have admitted it.
//   - legit deny: denied although O ≤ limit — the client sent no more than
//     the limit by any measure. Under sustained overload false denies mostly
//     measure which of many waiting requests gets a freed slot; a legit deny
//     is a client wronged, Cloudflare's "false positive".
//
// False allows plus false denies, over all decisions, is the wrong-decision
// rate, comparable to Cloudflare's 0.003% on a mix of many sources.
type oracle struct {
	window, limit int64
	keys          []keyLog
	firsts        []keyFirsts // per key, beside keys: read only past the limit

	decisions, admitted   int64
	falseAllow, falseDeny int64
	legitDeny             int64
	worst                 int64 // max over keys and time of A − limit (≥ 0)

	// Per (key, fixed window [j·window, (j+1)·window)) that admitted any hit.
	fixedExcess, fixedWindows int64 // Σ max(0, admitted − limit), and the count
	hist                      []int64

	// The tracked key's largest A per series step.
	tracked    int
	seriesStep int64
	series     []int64

	lags []int64 // per key that crossed and was denied: first deny − crossing
}

// keyLog is one key's log and the state every decision reads: 64 bytes, one
// cache line, since with hundreds of thousands of keys each decision's first
// touch of it is a miss.
type keyLog struct {
	log ring
	// The current fixed window's start and admitted hits; fixedStart < 0
	// before the key's first decision.
	fixedStart, fixedCount int64
}

// keyFirsts is when a key first went over the limit and was first denied.
type keyFirsts struct {
	crossing, firstDeny int64 // virtual ns; -1 while not seen
}

// ring is a key's offered hits in time order, oldest from head on, each
// marked admitted or not, with the sums of both in the window. One log, not
// one per sum: with hundreds of thousands of keys each log is a cache miss.
type ring struct {
	log          []hit
	head         int
	adm, offered int64
}

// hit is n hits offered at at; admitted ones have n > 0, denied ones n < 0.
type hit struct{ at, n int64 }

func (r *ring) push(at, n int64, admitted bool) {
	r.offered += n
	if admitted {
		r.adm += n
	} else {
		n = -n
	}
	r.log = append(r.log, hit{at, n})
}

// expire drops hits at or before horizon.
func (r *ring) expire(horizon int64) {
	for r.head < len(r.log) && r.log[r.head].at <= horizon {
		if n := r.log[r.head].n; n > 0 {
			r.adm -= n
			r.offered -= n
		} else {
			r.offered += n
		}
		r.head++
	}
	// Compact once the expired part is at least half the log: amortized
	// O(1) a hit, and a key's log stays within twice its live hits (plus a
	// few), which matters with hundreds of thousands of keys.
	if r.head == len(r.log) {
		r.log, r.head = r.log[:0], 0
	} else if r.head >= 8 && r.head*2 >= len(r.log) {
		n := copy(r.log, r.log[r.head:])
		r.log, r.head = r.log[:n], 0
	}
}

// newOracle returns an oracle for keys keys (indexed from 0) whose series
// follows key tracked in steps of seriesStep ns over a run of duration ns.
func newOracle(window, limit int64, keys, tracked int, seriesStep, duration int64) *oracle {
	o := &oracle{
		window: window, limit: limit,
		keys:       make([]keyLog, keys),
		firsts:     make([]keyFirsts, keys),
		hist:       make([]int64, len(OvershootBuckets)+1),
		tracked:    tracked,
		seriesStep: max(seriesStep, 1),
	}
	o.series = make([]int64, (duration+o.seriesStep-1)/o.seriesStep)
	for i := range o.keys {
		o.keys[i].fixedStart = -1
		o.firsts[i] = keyFirsts{crossing: -1, firstDeny: -1}
	}
	return o
}

// roll closes key k's fixed window if now is past it.
func (o *oracle) roll(k *keyLog, now int64) {
	start := now - now%o.window
	if start == k.fixedStart {
		return
	}
	o.closeWindow(k)
	k.fixedStart, k.fixedCount = start, 0
}

// closeWindow accounts k's current fixed window, if it admitted anything.
func (o *oracle) closeWindow(k *keyLog) {
	if k.fixedCount == 0 {
		return
	}
	excess := max(k.fixedCount-o.limit, 0)
	o.fixedExcess += excess
	o.fixedWindows++
	pct := 100 * float64(excess) / float64(o.limit)
	b := len(OvershootBuckets)
	for i, edge := range OvershootBuckets {
		if pct <= edge {
			b = i
			break
		}
	}
	o.hist[b]++
	k.fixedCount = 0
}

// decide grades a decision of hits on key ki at now, admitted or not, and
// counts it.
func (o *oracle) decide(ki int, now, hits int64, admitted bool) {
	k := &o.keys[ki]
	k.log.expire(now - o.window)
	o.roll(k, now)
	o.decisions++
	fits := k.log.adm+hits <= o.limit
	k.log.push(now, hits, admitted)
	if f := &o.firsts[ki]; !fits && f.crossing < 0 {
		f.crossing = now
		if f.firstDeny >= 0 {
			o.lags = append(o.lags, f.firstDeny-now)
		}
	}
	if admitted {
		if !fits {
			o.falseAllow++
		}
		o.admitted += hits
		k.fixedCount += hits
		o.worst = max(o.worst, k.log.adm-o.limit)
	} else {
		if fits {
			o.falseDeny++
		}
		if k.log.offered <= o.limit {
			o.legitDeny++
		}
		if f := &o.firsts[ki]; f.firstDeny < 0 {
			f.firstDeny = now
			if f.crossing >= 0 {
				o.lags = append(o.lags, now-f.crossing)
			}
		}
	}
	if ki == o.tracked {
		if i := now / o.seriesStep; i < int64(len(o.series)) {
			o.series[i] = max(o.series[i], k.log.adm)
		}
	}
}

// finish closes every key's last fixed window.
func (o *oracle) finish() {
	for i := range o.keys {
		o.closeWindow(&o.keys[i])
	}
}

// quantiles summarises samples (ns), sorting them in place.
func quantiles(samples []int64) Quantiles {
	if len(samples) == 0 {
		return Quantiles{}
	}
	slices.Sort(samples)
	at := func(q float64) int64 { return samples[int(q*float64(len(samples)-1))] }
	return Quantiles{
		N:   int64(len(samples)),
		P50: time.Duration(at(0.5)), P99: time.Duration(at(0.99)), Max: time.Duration(samples[len(samples)-1]),
	}
}
