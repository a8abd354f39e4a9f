package simulate

import (
	"slices"
	"time"
	"unsafe"
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

// keyLog is one key's log and the state every decision reads. With hundreds
// of thousands of keys each decision's first touch of its key is a cache miss
// (and, on a VM, a costly TLB miss), so a key's most recent hits live inline:
// keyLog is 128 bytes, two adjacent cache lines in one page (the backing
// array of a large []keyLog is page-aligned, and 128 divides the page size),
// the first holding the sums, the fixed window and the spill's header and
// oldest entry, the second the inline ring. Only a key with more than inlineHits live hits
// touches a second place in memory, its spill.
//
// The log is every offered hit in the window, one entry a hit, in time order:
// the spill's live entries sp[spHead:] (the oldest), then the inline ring's
// n entries from in[head] on (the newest). When the ring is full a push first
// moves all of it to the spill's tail, so every spill entry is at or before
// every inline one; expiring drains the spill first.
type keyLog struct {
	// The current fixed window's start and admitted hits; fixedStart < 0
	// before the key's first decision.
	fixedStart, fixedCount int64
	// The spill's oldest live entry, sp[spHead], when it has one: expiring
	// reads the spill only once it has something to drop.
	spFirst entry
	sp      []entry // the spill, allocated only once the ring overflows
	// Admitted and offered hits in the log: in the window once expired.
	// The log holds one entry a hit, so these are far below 2^31.
	adm, offered int32
	spHead       int32
	head, n      uint8
	in           [inlineHits]entry
}

// inlineHits is how many hits a key keeps inline: what fills keyLog's second
// cache line. A power of two, for the ring's index arithmetic.
const inlineHits = 8

// entry is one hit offered at virtual time t ≥ 0 (ns): t<<1, with the low
// bit set when it was admitted.
type entry int64

// keyFirsts is when a key first went over the limit and was first denied.
type keyFirsts struct {
	crossing, firstDeny int64 // virtual ns; -1 while not seen
}

// push appends a hit at at (≥ 0, and at or after every hit in the log).
func (k *keyLog) push(at int64, admitted bool) {
	e := entry(at << 1)
	k.offered++
	if admitted {
		e |= 1
		k.adm++
	}
	if k.n == inlineHits {
		// Spill the whole ring: one touch of the spill per inlineHits pushes.
		if int(k.spHead) == len(k.sp) {
			k.spFirst = k.in[k.head]
		}
		k.sp = append(k.sp, k.in[k.head:]...)
		k.sp = append(k.sp, k.in[:k.head]...)
		k.head, k.n = 0, 0
	}
	k.in[(k.head+k.n)&(inlineHits-1)] = e
	k.n++
}

// expire drops hits at or before horizon.
func (k *keyLog) expire(horizon int64) {
	lim := entry(horizon<<1 | 1) // e ≤ lim ⇔ e's time ≤ horizon
	if int(k.spHead) < len(k.sp) {
		if k.spFirst > lim {
			return // the spill's oldest is live, so is every later hit
		}
		h := int(k.spHead)
		for h < len(k.sp) && k.sp[h] <= lim {
			k.adm -= int32(k.sp[h] & 1)
			k.offered--
			h++
		}
		// Compact once the expired part is at least half the spill:
		// amortized O(1) a hit, and the spill stays within twice its
		// live hits (plus a few), which matters with hundreds of
		// thousands of keys.
		if h == len(k.sp) {
			k.sp, h = k.sp[:0], 0
		} else if h >= 8 && h*2 >= len(k.sp) {
			k.sp, h = k.sp[:copy(k.sp, k.sp[h:])], 0
		}
		k.spHead = int32(h)
		if h < len(k.sp) {
			k.spFirst = k.sp[h]
			return // the spill's oldest is live, so is every inline hit
		}
	}
	for k.n > 0 && k.in[k.head] <= lim {
		k.adm -= int32(k.in[k.head] & 1)
		k.offered--
		k.head = (k.head + 1) & (inlineHits - 1)
		k.n--
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

// prefetch starts fetching key ki's log into cache: both its lines.
func (o *oracle) prefetch(ki int) {
	k := &o.keys[ki]
	prefetch(uintptr(unsafe.Pointer(k)))
	prefetch(uintptr(unsafe.Pointer(&k.in)))
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

// decide grades a decision of hits (≥ 0; every caller passes 1) on key ki at
// now (≥ 0, below 2^62), admitted or not, and counts it. The log holds one
// entry per hit, so a decision of n hits pushes n entries.
func (o *oracle) decide(ki int, now, hits int64, admitted bool) {
	k := &o.keys[ki]
	k.expire(now - o.window)
	o.roll(k, now)
	o.decisions++
	fits := int64(k.adm)+hits <= o.limit
	for range hits {
		k.push(now, admitted)
	}
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
		o.worst = max(o.worst, int64(k.adm)-o.limit)
	} else {
		if fits {
			o.falseDeny++
		}
		if int64(k.offered) <= o.limit {
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
			o.series[i] = max(o.series[i], int64(k.adm))
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
