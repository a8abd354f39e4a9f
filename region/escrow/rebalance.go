package escrow

import (
	"slices"
	"strings"
)

// Rebalance moves this replica's unused allowance toward demand, for every
// key it knows, and returns the gives it made (absolute, as published). The
// gives are in the ledger's own state already — this replica holds less at
// once — and in the next Delta; the driver saves them before it publishes
// them. Only givers act: no replica ever takes.
//
// For each key, with w the current window at now:
//
//   - Demand. Replica k's demand d_k is the larger of two estimates of the
//     hits it asks for per window, both from its requested counters R_k as
//     heard: what it asked over the last window length, as the sliding
//     window counts, R_k(w−1)·(1−e) + R_k(w); and the current window's pace
//     scaled to a whole window, R_k(w)·W/max(elapsed, W/8). The first
//     follows steady demand and lets the demand of a client that left decay
//     within a window; the second sees a new client within a flush. The
//     floor of an eighth of a window keeps a few early requests from
//     standing for more than 8× their number. A replica not heard from for
//     a whole window has no demand: what it was given would be stranded.
//   - Targets. target_k = Scale·d_k/Σd (Raghavan et al.'s flow proportional
//     share, Doorman's PROPORTIONAL_SHARE): a replica without demand has a
//     target of 0, one with demand its proportional part. No demand
//     anywhere moves nothing.
//   - Gives. If this replica holds more than its target plus a band of
//     max(Scale/256, Scale/(8N)), it gives the excess — from w only what it
//     has not used — to the replicas below their targets (as it estimates
//     their fractions: start share + gives heard to them − their gives
//     heard), in proportion to their deficits. It does the same for w+1,
//     which has not started, so a replica demanded of now starts the next
//     window with its share (a pre-give); from w+1 it keeps only its own
//     target. A give smaller than Scale/256 is not made (no dust).
//
// A give of window x never exceeds what this replica holds of x minus what
// its admissions of x need (used): for a fixed window ⌈C·Scale/L⌉, for a
// sliding one ⌈C·Scale/(L − P̂·(1−e))⌉ at now. So after any give, C ≤
// f·L/Scale (or f/Scale·(L − P̂(1−e))) still holds.
func (l *Ledger) Rebalance(now int64) []Item {
	now = l.clock(now)
	l.act()
	type keyRef struct {
		key  string
		spec Spec
		cur  int64
	}
	var keys []keyRef
	for _, e := range l.entries {
		cur := windowStart(now, e.spec.Window)
		switch e.window {
		case cur:
		case cur - e.spec.Window:
			if l.entries[entryKey{e.key, cur}] != nil {
				continue
			}
		default:
			continue
		}
		keys = append(keys, keyRef{e.key, e.spec, cur})
	}
	slices.SortFunc(keys, func(a, b keyRef) int { return strings.Compare(a.key, b.key) })
	var out []Item
	for _, k := range keys {
		out = l.rebalanceKey(now, k.key, k.spec, k.cur, out)
	}
	return out
}

// rebalanceKey is Rebalance for one key whose current window starts at cur.
func (l *Ledger) rebalanceKey(now int64, key string, spec Spec, cur int64, out []Item) []Item {
	win := uint64(spec.Window)
	ec := l.entries[entryKey{key, cur}]
	ep := l.entries[entryKey{key, cur - spec.Window}]
	elapsed := max(uint64(now-cur), win/8, 1)
	var sum uint64
	for k := range l.names {
		l.demand[k] = 0
		if k != l.self && l.alive[k] < now-spec.Window {
			continue
		}
		var last, rate uint64 // requested over the last W; the current window's rate
		if ep != nil {
			last = mulDiv(ep.req[k], win-min(uint64(now-cur), win), win)
		}
		if ec != nil {
			last = addSat(last, ec.req[k])
			rate = mulDiv(ec.req[k], win, elapsed)
		}
		d := max(last, rate)
		l.demand[k] = d
		sum = addSat(sum, d)
	}
	if sum == 0 {
		return out
	}
	for k := range l.names {
		l.target[k] = mulDiv(l.scale, l.demand[k], sum)
	}
	out = l.giveFrom(now, key, spec, cur, true, out)
	return l.giveFrom(now, key, spec, cur+spec.Window, false, out)
}

// giveFrom makes this replica's gives of key's window starting at w, toward
// the targets in l.target; current says whether w is the window at now.
func (l *Ledger) giveFrom(now int64, key string, spec Spec, w int64, current bool, out []Item) []Item {
	e := l.entries[entryKey{key, w}]
	f := l.startShare(l.self, w)
	if e != nil {
		f = l.held(e)
	}
	tself := l.target[l.self]
	if f <= addSat(tself, l.band) {
		return out
	}
	excess := f - tself
	if current && e != nil {
		used := l.usedUnits(e, now)
		if used >= f {
			return out
		}
		excess = min(excess, f-used)
	}
	var sumDef uint64
	for k := range l.names {
		l.deficit[k] = 0
		if k == l.self {
			continue
		}
		l.deficit[k] = subSat(l.target[k], l.estimate(e, k, w))
		sumDef = addSat(sumDef, l.deficit[k])
	}
	x := min(excess, sumDef)
	if x < l.minGive {
		return out
	}
	if e == nil {
		if e = l.entryFor(key, w, spec, true); e == nil {
			return out
		}
	}
	for k := range l.names {
		g := mulDiv(x, l.deficit[k], sumDef)
		if k == l.self || g < l.minGive {
			continue
		}
		v := addSat(l.giveTo(e, k, l.inc[k]), g)
		l.raiseGive(e, l.self, k, l.inc[k], v)
		l.markDirty(e)
		out = append(out, Item{Kind: Give, Key: key, Window: w, Spec: e.spec, Replica: l.names[l.self],
			To: l.names[k], ToIncarnation: l.inc[k], Value: v})
	}
	return out
}

// usedUnits is the allowance, in units, that this incarnation's admissions
// of e's window need at now: the smallest f with C·d ≤ f·x (see room), or
// all of it when the room is 0.
func (l *Ledger) usedUnits(e *entry, now int64) uint64 {
	c := l.ownUsed(e)
	if c == 0 {
		return 0
	}
	d, x := l.room(e, now)
	if x == 0 {
		return l.scale
	}
	return mulDivCeil(c, d, x)
}

// estimate is replica k's fraction of the window starting at w as this
// ledger sees it: k's start share, plus the gives heard to k (to its
// current incarnation only, in a window that began before it), minus k's
// out-gives heard. It only steers gives; no decision depends on it.
func (l *Ledger) estimate(e *entry, k int, w int64) uint64 {
	start := l.startShare(k, w)
	if e == nil {
		return start
	}
	in := e.in[k]
	if w < l.inc[k] {
		in = 0
		for _, g := range e.gives {
			if g.to == k && g.toInc == l.inc[k] {
				in = addSat(in, g.value)
			}
		}
	}
	return subSat(addSat(start, in), e.out[k])
}
