package estimate

import "time"

// Recent remembers when this PoP admitted its latest hits of one key: the
// running total after each admission, for the last recentLen of them. It
// also holds what settle goes by for the key (Due, Judge). Make one with
// NewRecent. It is not safe for concurrent use.
type Recent struct {
	at, total [recentLen]int64
	next, n   int // where the next admission goes, and how many are held
	sum       int64
	from      int64 // when it began to remember: it knows nothing of before
	near      int64 // when the key came near its limit (nearLimit); 0: not yet
	// What settle goes by: the latest two windows (their starts) in which
	// this PoP found the key at its limit; the window whose settled count
	// it last judged; the correction it keeps (in hits); and the
	// PoP's own count as its store last read it, for a PoP of several
	// servers (PopCount).
	full, fullPrev int64
	judged         int64
	correction     float64
	popAt          [2]int64
	popN           [2]uint64
	// win is the start of the window of the latest admission; lastBefore
	// is when the latest admission before that window was (0: none
	// remembered), and totalBefore the running total after it (see Since).
	win, lastBefore, totalBefore int64
}

const recentLen = 32

// recentIdle is how long a key's Recent outlives its last admission.
const recentIdle = int64(10 * time.Second)

// A key is near its limit from 1/nearLimit of it (a quarter) counted: from
// then this PoP guesses what the others admitted of it (Unheard, with what
// it remembers admitting: Recent), and it is hot (the store's Hot). A key
// with no count in the previous window — new, or back after a quiet window
// — is remembered already from 1/nearLimitNew of it (a 32nd), though near
// only from a quarter: such a key is as a rule a client that has just
// begun, and when the agreed clock steps this PoP across a window boundary
// in its first second (the store's moveClock), the hits admitted since the
// new window began must be counted in it too, which only remembered ones
// can be. With the sprayer's key remembered from a quarter only, skew's
// clocks stepped before any PoP had come near, and each PoP's hits of the
// new window were forgotten with the old one. The early memory serves the
// step alone; near from a 32nd as well, it moved the whole estimate of a
// new key, for the worse in places (docs/accuracy-log.md, "nearLimitNew").
const (
	nearLimit    = 4.0
	nearLimitNew = 32.0
)

// NearLimit reports whether a key is near its limit (see nearLimit) after a
// check that found cur and prev counted of it in the current and previous
// window, unheard guessed, of a limit of limit.
func NearLimit(cur, prev int64, unheard float64, limit int64) bool {
	return nearLimit*(float64(cur+prev)+unheard) >= float64(limit)
}

// RememberNew reports whether a key not near its limit is remembered all
// the same after such a check: it had no count in the previous window and
// has 1/nearLimitNew of its limit (see nearLimit). (Written as not below,
// so that a guess that is not a number remembers.)
func RememberNew(cur, prev int64, unheard float64, limit int64) bool {
	return prev == 0 && !(nearLimitNew*(float64(cur)+unheard) < float64(limit))
}

// NewRecent returns the memory of a key's admissions that begins at now: it
// knows nothing of before.
func NewRecent(now int64) *Recent { return &Recent{from: now} }

// From returns when r began to remember (unix ns).
func (r *Recent) From() int64 { return r.from }

// Near reports whether the key came near its limit (Add).
func (r *Recent) Near() bool { return r.near != 0 }

// Add remembers an admission of hits at now, in the window that starts at
// start, after a check that found the key near its limit or not
// (NearLimit): the first near one marks when the key came near.
func (r *Recent) Add(now, start, hits int64, near bool) {
	if near && r.near == 0 {
		r.near = now
	}
	r.add(now, start, hits)
}

// add remembers an admission of hits at now, in the window that starts at
// start.
func (r *Recent) add(now, start, hits int64) {
	if start > r.win {
		r.win = start
		r.lastBefore, r.totalBefore = r.last(), r.sum
	}
	r.sum += hits
	r.at[r.next], r.total[r.next] = now, r.sum
	r.next = (r.next + 1) % recentLen
	r.n = min(r.n+1, recentLen)
}

// Since returns how many hits were admitted after t, up to now. When t is
// further back than the admissions it holds reach, it extrapolates at the
// rate they came: a key admitted at 1000/s fills the ring in 32 ms while the
// age of news from another continent is 50–150 ms, and counting only what
// the ring held took a third of the hits for the whole age
// (docs/accuracy-log.md, "recentHits.since").
//
// But never more than were admitted since the window began when t is after
// the latest admission before it: the ring then holds hits the window's
// start let in after a pause, and their rate is not the rate over t's span.
// Traced on anycast: the room closed half-way through a window and opened
// at the next; 32 admissions in its first 67 ms filled the ring, and the
// hits since a stalled replica's news 443 ms back, which were those 32,
// came out as 224 — the mirror then guessed 70 hits for each of two
// replicas that had admitted a few, and the PoP denied at its limit's
// estimate less a tenth.
func (r *Recent) Since(t, now int64) float64 {
	for k := 1; k <= r.n; k++ {
		i := (r.next - k + recentLen) % recentLen
		if r.at[i] <= t {
			return float64(r.sum - r.total[i])
		}
	}
	if r.n < recentLen {
		return float64(r.sum) // everything it counted was after t (see from)
	}
	oldest := r.next                         // the ring is full: the next slot holds the oldest
	held := float64(r.sum - r.total[oldest]) // admitted after the oldest held
	span := now - r.at[oldest]
	if span <= 0 {
		return held
	}
	g := held * float64(now-t) / float64(span)
	if r.lastBefore != 0 && r.lastBefore <= t {
		g = min(g, float64(r.sum-r.totalBefore))
	}
	return g
}

// last returns when the latest admission was, or 0.
func (r *Recent) last() int64 {
	if r.n == 0 {
		return 0
	}
	return r.at[(r.next-1+recentLen)%recentLen]
}

// Idle reports whether r has outlived its use at now: only the last age of
// news (well under a second) is ever read, and an idle key's admissions
// cost memory for nothing.
func (r *Recent) Idle(now int64) bool { return now-r.last() > recentIdle }

// Shift moves the times r remembers by d: the clock they are on stepped.
func (r *Recent) Shift(d int64) {
	for i := range r.n {
		r.at[(r.next-1-i+2*recentLen)%recentLen] += d
	}
	r.from += d
	if r.lastBefore != 0 {
		r.lastBefore += d
	}
	if r.near != 0 {
		r.near += d
	}
}

// Reached notes that this PoP found the key at its limit in the window
// that starts at start.
func (r *Recent) Reached(start int64) {
	if r.full != start {
		r.fullPrev, r.full = r.full, start
	}
}

// PopCount notes the PoP's own count n of the key in the window that starts
// at window (of length w), as a store of several servers read it: the
// settled count must hold every server's hits, and the estimate's own
// count holds this server's only.
func (r *Recent) PopCount(window, w int64, n uint64) {
	i := (window / w) & 1
	if r.popAt[i] != window {
		r.popAt[i], r.popN[i] = window, 0
	}
	r.popN[i] = max(r.popN[i], n)
}
