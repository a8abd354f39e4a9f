package estimate

import "time"

// The settled count's correction (settle: Due and Judge).
//
// Unheard's guess runs high on purpose where PoPs compete for the room a
// sliding window frees (the silence since a replica's news grows the guess
// though that replica sends news right after it admits: half a hit too
// many a replica): the bias stands in for the spread of the PoPs' estimates
// and the winner's curse — the PoP whose estimate is lowest takes the room
// — and without it the PoPs overshot together. But how much curse there is
// to pay for depends on how the demand is spread, which the guess cannot
// see. Where one PoP has most of a key's demand (world-anycast: one client
// at 150/s at one PoP, five lighter ones at five others) there is little,
// and the bias only denied: the PoPs together settled under the limit and
// denied more than one central store.
// Where many busy PoPs compete (world-busy) there is more than the bias
// pays for, and the windows settled over the limit.
//
// The count a window settled at says which: once every replica's news of
// it has arrived (settleAfter into the next window), a PoP knows how many
// hits all of them admitted in it. If this PoP found the key at its limit
// in that window, settle steers what it adds to the guess by SettleGain of
// how far the count settled outside a band: more than SettleSlack under the
// limit, the guess ran high and the correction goes down; over the limit,
// it ran low and the correction goes up; within the band a correction
// below zero gives back what the window shows it need not take off, and
// one above zero stays. It stays within SettleBound of the limit either
// way, and a window not at the limit here halves it. Every PoP reads the
// same settled counts, so they move together.
//
// The band is there because per-client keys settle at their limit: aimed
// at the limit less SettleSlack both ways, they were pushed under it, and
// with a slack of 0 or 1 the count sat on the limit (docs/accuracy-log.md,
// "settleGain").
//
// Sliding windows only. A fixed window's PoPs overshoot together just after
// it rolls, when all of them find room at once; steered up by that, the
// guess held every PoP short of the limit for the rest of each window
// (docs/accuracy-log.md, "settleGain").
const (
	settleAfter = int64(300 * time.Millisecond)
	SettleSlack = 2.0
	SettleGain  = 0.3
	SettleBound = 0.05
)

// Correction returns the correction settle keeps for the key's guess (see
// above), in hits: what the store adds to Unheard (the sum no less than 0).
func (r *Recent) Correction() float64 { return r.correction }

// Due reports whether the previous window's settled count is due to be
// judged (Judge) at now, in the window of length w that starts at start:
// not judged yet, settleAfter into this window (half the window for a
// short one), with none of clocks of the limit's scope (in; nil: every
// replica) held up (its count is not settled).
func (r *Recent) Due(start, w, now int64, clocks []*Clock, in func(name string) bool) bool {
	if r.judged == start || now-start < min(settleAfter, w/2) {
		return false
	}
	for _, c := range clocks {
		if (in == nil || in(c.name)) && c.held(now) {
			return false
		}
	}
	return true
}

// Judge judges the previous window's settled count once Due: own is this
// PoP's count of the key in the window before the one that starts at
// start (of length w), others the other replicas' of the scope, and lim
// the key's limit. It steers the correction (see above) and returns the
// settled count and whether this PoP found the key at its limit in that
// window (Reached); if not, it only halves the correction, and the count
// is not judged.
func (r *Recent) Judge(start, w, lim int64, own, others uint64) (settled float64, atLimit bool) {
	r.judged = start
	prev := start - w
	if r.full != prev && r.fullPrev != prev {
		r.correction /= 2
		return 0, false
	}
	if i := (prev / w) & 1; r.popAt[i] == prev {
		own = max(own, r.popN[i])
	}
	settled = float64(own + others)
	l := float64(lim)
	switch {
	case settled < l-SettleSlack: // the guess ran high
		r.correction += SettleGain * (settled - (l - SettleSlack))
	case settled > l: // it ran low
		r.correction += SettleGain * (settled - l)
	case r.correction < 0: // within the band: give back what need not be taken off
		r.correction = min(r.correction+SettleGain*(settled-(l-SettleSlack)), 0)
	}
	r.correction = min(max(r.correction, -SettleBound*l), SettleBound*l)
	return settled, true
}
