package escrow

import (
	"cmp"
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
//
// Which keys. Rebalance looks only at keys whose gives may have changed, so
// that a flush costs what changed rather than every key held. A give from
// this replica needs both another replica's demand and allowance here above
// the band; so after a look that found no other replica ever requesting the
// key, or this replica holding no more than the band of the current and the
// next window, the key is set aside, until one of the two can change:
// another replica's requested count grows (Apply), a give to this replica
// arrives (Apply), or — for a key another replica requested — the next
// window boundary, where a new window brings a new start share to pre-give.
// What else moves with time alone (the decay of the estimates above, the
// sliding room) changes the gives of a key only while it is looked at
// anyway. A key with no window at or around now is dropped.
func (l *Ledger) Rebalance(now int64) []Item {
	now = l.clock(now)
	l.act()
	clear(l.touched) // what they were touched for is done now
	for at, keys := range l.wake {
		if at > now {
			continue
		}
		for k, spec := range keys {
			l.active[k] = spec
		}
		delete(l.wake, at)
	}
	type keyRef struct {
		key  string
		spec Spec
	}
	keys := make([]keyRef, 0, len(l.active))
	for k, spec := range l.active {
		keys = append(keys, keyRef{k, spec})
	}
	slices.SortFunc(keys, func(a, b keyRef) int { return strings.Compare(a.key, b.key) })
	var out []Item
	for _, k := range keys {
		win := k.spec.Window
		cur := windowStart(now, win)
		ec, ep := l.entries[entryKey{k.key, cur}], l.entries[entryKey{k.key, cur - win}]
		var stay bool
		switch e := cmp.Or(ec, ep); {
		case e != nil:
			out, stay = l.rebalanceKey(now, k.key, e.spec, cur, out)
		case l.entries[entryKey{k.key, cur + win}] == nil:
			delete(l.active, k.key) // nothing left of it
			continue
		}
		if stay {
			continue
		}
		delete(l.active, k.key)
		if l.requestedElsewhere(k.key, cur, win) {
			at := cur + win
			if l.wake[at] == nil {
				l.wake[at] = make(map[string]Spec)
			}
			l.wake[at][k.key] = k.spec
		}
	}
	return out
}

// requestedElsewhere reports whether another replica requested key in the
// window starting at cur, the one before or the one after.
func (l *Ledger) requestedElsewhere(key string, cur, win int64) bool {
	for _, w := range [...]int64{cur - win, cur, cur + win} {
		e := l.entries[entryKey{key, w}]
		if e == nil {
			continue
		}
		for k, r := range e.req {
			if k != l.self && r > 0 {
				return true
			}
		}
	}
	return false
}

// rebalanceKey is Rebalance for one key whose current window starts at cur.
// It reports whether the key must be looked at again next time: whether
// another replica has demand and this replica holds more than the band of
// the current or the next window.
func (l *Ledger) rebalanceKey(now int64, key string, spec Spec, cur int64, out []Item) ([]Item, bool) {
	if !l.targets(now, key, spec, cur) { // no demand elsewhere: nothing to give
		return out, false
	}
	out = l.giveFrom(now, key, spec, cur, true, out)
	out = l.giveFrom(now, key, spec, cur+spec.Window, false, out)
	return out, l.heldOf(key, cur) > l.band || l.heldOf(key, cur+spec.Window) > l.band
}

// targets sets l.demand and l.target for key at now, its current window
// starting at cur (see Rebalance, "Demand" and "Targets"). It reports false,
// leaving l.target unset, when no other replica has demand.
func (l *Ledger) targets(now int64, key string, spec Spec, cur int64) bool {
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
	if sum == l.demand[l.self] {
		return false
	}
	for k := range l.names {
		l.target[k] = mulDiv(l.scale, l.demand[k], sum)
	}
	return true
}

// heldOf is held for the window of key starting at w, the start share if
// this replica has no entry for it.
func (l *Ledger) heldOf(key string, w int64) uint64 {
	if e := l.entries[entryKey{key, w}]; e != nil {
		return l.held(e)
	}
	return l.startShare(l.self, w)
}

// giveFrom makes this replica's gives of key's window starting at w, toward
// the targets in l.target; current says whether w is the window at now.
func (l *Ledger) giveFrom(now int64, key string, spec Spec, w int64, current bool, out []Item) []Item {
	e := l.entries[entryKey{key, w}]
	x, sumDef := l.giveable(now, e, w, current)
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

// giveable is what this replica would give of the window starting at w (e,
// nil if it has no entry for it) toward the targets in l.target: x, its
// excess over its own target — of the current window only what it has not
// used — up to the others' deficits, which it leaves in l.deficit, summed
// in sumDef. An x of 0 means it gives nothing: it holds no more than its
// target plus the band, or has used what it holds.
func (l *Ledger) giveable(now int64, e *entry, w int64, current bool) (x, sumDef uint64) {
	f := l.startShare(l.self, w)
	if e != nil {
		f = l.held(e)
	}
	tself := l.target[l.self]
	if f <= addSat(tself, l.band) {
		return 0, 0
	}
	excess := f - tself
	if current && e != nil {
		used := l.usedUnits(e, now)
		if used >= f {
			return 0, 0
		}
		excess = min(excess, f-used)
	}
	for k := range l.names {
		l.deficit[k] = 0
		if k == l.self {
			continue
		}
		l.deficit[k] = subSat(l.target[k], l.estimate(e, k, w))
		sumDef = addSat(sumDef, l.deficit[k])
	}
	return min(excess, sumDef), sumDef
}

// wouldGive reports whether a Rebalance at now would give some of e's
// window, the current one: another replica has demand, this replica holds
// more than its target plus the band and has not used it, and some replica
// is short of its target by at least the smallest give. It changes no
// state but the scratch slices.
func (l *Ledger) wouldGive(now int64, e *entry) bool {
	if !l.targets(now, e.key, e.spec, e.window) {
		return false
	}
	x, sumDef := l.giveable(now, e, e.window, true)
	if x < l.minGive {
		return false
	}
	for k := range l.names {
		if k != l.self && mulDiv(x, l.deficit[k], sumDef) >= l.minGive {
			return true
		}
	}
	return false
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
