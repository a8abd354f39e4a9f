// Package limit holds edgelimit's rate limit algorithms as pure functions of a
// key's state, the time and the number of hits. It does no IO, reads no clock and
// keeps no state of its own: a store owns the State values and the locking, and
// hands the time in. Every store (the embedded one, the Redis Lua scripts, the
// simulator) must agree with this package; the shared table in limittest pins it.
//
// Time is an int64 count of nanoseconds since the Unix epoch. Windows are aligned
// to the epoch (a minute window starts on the minute, a day window at 00:00 UTC),
// so that every server and every PoP agrees on where a window begins.
//
// It imports the standard library only.
package limit

import (
	"fmt"
	"math"
	"strings"
)

// Algorithm selects how a limit counts.
type Algorithm uint8

const (
	// SlidingWindow estimates the rate over the last window from two fixed windows:
	// prev × (1 − elapsed/window) + cur. The default.
	SlidingWindow Algorithm = iota
	// FixedWindow counts hits per epoch-aligned window. It admits up to twice the
	// limit across a window boundary.
	FixedWindow
	// TokenBucket refills Limit tokens per window up to Burst and spends one per hit.
	TokenBucket
	// GCRA is the generic cell rate algorithm: a token bucket kept as one
	// theoretical arrival time, with Burst as its tolerance.
	GCRA
	// SlidingLog keeps the time of every admitted hit in the last window. Exact, but
	// its memory grows with the limit, so it is for small limits (MaxLogLimit).
	SlidingLog
)

// tolerance absorbs float rounding in the bucket refill and the sliding
// window's weighted estimate: a request that fits but for 10⁻⁹ of a hit fits.
// Without it, a client that waits exactly the RetryAfter it was given could
// find 2.9999999999 tokens for 3 hits and be denied again. Stores that compute
// the same formulas elsewhere (the Redis Lua scripts) use the same tolerance.
const tolerance = 1e-9

// MaxLogLimit is the largest limit SlidingLog accepts: its state holds one
// timestamp per admitted hit.
const MaxLogLimit = 1000

var algorithmNames = [...]string{"sliding_window", "fixed_window", "token_bucket", "gcra", "sliding_log"}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", a)
}

// ParseAlgorithm maps a rule file's algorithm name to an Algorithm. The empty
// string is SlidingWindow.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return SlidingWindow, nil
	}
	for i, n := range algorithmNames {
		if s == n {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", s, strings.Join(algorithmNames[:], ", "))
}

// Spec is one limit: Limit requests per Window, counted by Algorithm.
type Spec struct {
	Algorithm Algorithm
	// Limit is the quota per window. Zero denies every hit.
	Limit int64
	// Window is the window length in nanoseconds; it must be > 0.
	Window int64
	// Burst is the bucket capacity of TokenBucket and GCRA; 0 means Limit.
	// Other algorithms ignore it.
	Burst int64
}

// Validate reports whether the spec can be evaluated.
func (s Spec) Validate() error {
	switch {
	case s.Algorithm > SlidingLog:
		return fmt.Errorf("unknown algorithm %d", s.Algorithm)
	case s.Window <= 0:
		return fmt.Errorf("window must be > 0, got %dns", s.Window)
	case s.Limit < 0:
		return fmt.Errorf("limit must be >= 0, got %d", s.Limit)
	case s.Burst < 0:
		return fmt.Errorf("burst must be >= 0, got %d", s.Burst)
	case s.Algorithm == SlidingLog && s.Limit > MaxLogLimit:
		return fmt.Errorf("sliding_log keeps one timestamp per hit and allows at most %d per window, got %d; use sliding_window", MaxLogLimit, s.Limit)
	}
	return nil
}

// Capacity is the bucket size of TokenBucket and GCRA: Burst, or Limit when
// Burst is 0. A zero Limit has no capacity whatever the burst: it denies
// every hit, as requests_per_unit 0 does in Envoy (and a bucket that never
// refills would otherwise never turn idle).
func (s Spec) Capacity() int64 {
	if s.Limit == 0 {
		return 0
	}
	if s.Burst > 0 {
		return s.Burst
	}
	return s.Limit
}

// State is the counting state of one key. Its zero value is a key never seen.
// Which fields mean what depends on the algorithm; a store keeps a State per key
// and must not share one between specs of different algorithms or windows.
// A State is not safe for concurrent use: its store serializes access.
type State struct {
	// Start is the start of the current window (SlidingWindow, FixedWindow), the
	// time of the last refill (TokenBucket, 0 = never), or the theoretical
	// arrival time (GCRA).
	Start int64
	// Cur and Prev count the hits of the current and the previous window.
	Cur, Prev int64
	// Tokens is the TokenBucket fill at Start.
	Tokens float64
	// Log holds SlidingLog's admitted hit times.
	Log *Ring
	// Unheard is, for a window algorithm counted across replicas, the hits
	// other replicas have probably admitted that this one has not heard of
	// yet, as the estimate at the decision's instant weighs them (see
	// store's extrapolation). The decision counts them as if admitted; Add
	// never changes them. Zero for a State counted in one place.
	Unheard float64
}

// Decision is one limit's answer for one request.
type Decision struct {
	// Allowed reports whether the hits fit.
	Allowed bool
	// Remaining is how many more hits would fit right after this decision
	// (after adding the hits when allowed). Never negative.
	Remaining int64
	// Reset is the time in nanoseconds until the limit's current window ends
	// (window algorithms) or until its bucket is full again (TokenBucket, GCRA,
	// SlidingLog's oldest hit leaving), measured after this decision.
	Reset int64
	// RetryAfter is, when denied, the time in nanoseconds until the same hits
	// would be allowed if nothing else arrives. It is 0 when allowed. When the
	// hits can never fit (more hits than the limit or burst), it is the time until
	// the key is entirely idle.
	RetryAfter int64
}

// Advance brings st forward to now without changing what it means: windows roll,
// buckets refill, expired log entries leave. A time earlier than st's own (a
// server whose clock lags) counts as st's time: state never moves backwards.
func (s Spec) Advance(st *State, now int64) {
	switch s.Algorithm {
	case SlidingWindow, FixedWindow:
		start := windowStart(now, s.Window)
		switch {
		case start <= st.Start:
			// Same window, or a lagging clock: keep counting in the newest window.
		case start == st.Start+s.Window:
			st.Prev, st.Cur, st.Start = st.Cur, 0, start
		default:
			st.Prev, st.Cur, st.Start = 0, 0, start
		}
	case TokenBucket:
		c := float64(s.Capacity())
		if st.Start == 0 {
			st.Tokens, st.Start = c, now
			return
		}
		if now > st.Start {
			st.Tokens = math.Min(c, st.Tokens+float64(now-st.Start)*float64(s.Limit)/float64(s.Window))
			st.Start = now
		}
		// A refill past capacity, or a lower limit after a rule reload, caps it.
		st.Tokens = math.Min(c, st.Tokens)
	case GCRA:
		// The theoretical arrival time needs no advancing.
	case SlidingLog:
		if st.Log != nil {
			st.Log.expire(now - s.Window)
		}
	}
}

// Peek decides whether hits more requests fit at now, without counting them.
// It requires st to have been advanced to now (Advance) and hits >= 1.
func (s Spec) Peek(st *State, now, hits int64) Decision {
	switch s.Algorithm {
	case SlidingWindow:
		return s.peekSliding(st, now, hits)
	case FixedWindow:
		return s.peekFixed(st, now, hits)
	case TokenBucket:
		return s.peekBucket(st, hits)
	case GCRA:
		return s.peekGCRA(st, now, hits)
	case SlidingLog:
		return s.peekLog(st, now, hits)
	}
	return Decision{}
}

// Add counts hits at now. It requires st to have been advanced to now and
// assumes Peek allowed them; it never checks the limit itself.
func (s Spec) Add(st *State, now, hits int64) {
	switch s.Algorithm {
	case SlidingWindow, FixedWindow:
		st.Cur += hits
	case TokenBucket:
		st.Tokens = max(st.Tokens-float64(hits), 0) // within tolerance of empty is empty
	case GCRA:
		st.Start = max(st.Start, now) + s.interval(hits)
	case SlidingLog:
		if st.Log == nil {
			st.Log = newRing(s.Limit)
		}
		st.Log.push(now, hits, s.Limit)
	}
}

// Take advances st to now, decides, and counts the hits when they fit: the
// whole check for a request that matched this one limit.
func (s Spec) Take(st *State, now, hits int64) Decision {
	s.Advance(st, now)
	d := s.Peek(st, now, hits)
	if d.Allowed {
		s.Add(st, now, hits)
	}
	return d
}

// IdleAt is the earliest time at which st holds nothing worth keeping: from then
// on it decides exactly as a fresh State would. Stores evict or expire keys by it.
func (s Spec) IdleAt(st *State) int64 {
	switch s.Algorithm {
	case SlidingWindow:
		if st.Cur > 0 {
			return st.Start + 2*s.Window
		}
		if st.Prev > 0 {
			return st.Start + s.Window
		}
		return st.Start
	case FixedWindow:
		if st.Cur > 0 {
			return st.Start + s.Window
		}
		return st.Start
	case TokenBucket:
		if st.Start == 0 || s.Limit == 0 {
			return st.Start
		}
		missing := float64(s.Capacity()) - st.Tokens
		return st.Start + ceilNanos(missing*float64(s.Window)/float64(s.Limit))
	case GCRA:
		return st.Start
	case SlidingLog:
		if st.Log == nil || st.Log.n == 0 {
			return 0
		}
		return st.Log.newest() + s.Window
	}
	return 0
}

func (s Spec) peekSliding(st *State, now, hits int64) Decision {
	w := s.Window
	elapsed := now - st.Start
	if elapsed < 0 { // lagging clock: treat as the start of the newest window
		elapsed = 0
	}
	end := st.Start + w
	weight := float64(w-elapsed) / float64(w)
	est := float64(st.Prev)*weight + float64(st.Cur) + st.Unheard
	d := Decision{Reset: max(end-now, 0)}
	if est+float64(hits) <= float64(s.Limit)+tolerance {
		d.Allowed = true
		d.Remaining = max(int64(math.Floor(float64(s.Limit)-est-float64(hits)+tolerance)), 0)
		return d
	}
	d.Remaining = max(int64(math.Floor(float64(s.Limit)-est)), 0)
	if hits > s.Limit {
		d.RetryAfter = max(s.IdleAt(st)-now, 1)
		return d
	}
	// RetryAfter rests on the counts heard only. Unheard is a guess at hits
	// other replicas admitted that news will soon replace with their
	// counts; a denial it alone makes is worth retrying at once, and must
	// not become a mitigation bit that holds every PoP until the window
	// ends on hits that may never show up.
	heard := est - st.Unheard
	if heard+float64(hits) <= float64(s.Limit)+tolerance {
		d.RetryAfter = 1
		return d
	}
	room := float64(s.Limit - hits) // est must fall to room
	if float64(st.Cur) <= room && st.Prev > 0 {
		// The previous window's share decays enough within this window:
		// prev × (w − e)/w + cur ≤ room  ⇔  e ≥ w − (room − cur)·w/prev.
		e := float64(w) - (room-float64(st.Cur))*float64(w)/float64(st.Prev)
		d.RetryAfter = max(ceilNanos(e)-elapsed, 1)
		return d
	}
	// Only in the next window, where cur becomes prev: cur × (w − e)/w ≤ room.
	e := float64(w)
	if st.Cur > 0 && room > 0 {
		e -= room * float64(w) / float64(st.Cur)
	}
	d.RetryAfter = (w - elapsed) + max(ceilNanos(e), 0)
	return d
}

func (s Spec) peekFixed(st *State, now, hits int64) Decision {
	end := st.Start + s.Window
	d := Decision{Reset: max(end-now, 0)}
	cur := st.Cur + int64(math.Ceil(st.Unheard-tolerance))
	if cur+hits <= s.Limit {
		d.Allowed = true
		d.Remaining = s.Limit - cur - hits
		return d
	}
	d.Remaining = max(s.Limit-cur, 0)
	if st.Cur+hits <= s.Limit {
		d.RetryAfter = 1 // denied on Unheard alone: see peekSliding
		return d
	}
	// The next window: also for more hits than the limit, which never fit —
	// a fresh window is as good as it gets.
	d.RetryAfter = max(end-now, 1)
	return d
}

func (s Spec) peekBucket(st *State, hits int64) Decision {
	c := float64(s.Capacity())
	perNano := float64(s.Limit) / float64(s.Window)
	d := Decision{}
	left := st.Tokens
	if left+tolerance >= float64(hits) {
		d.Allowed = true
		left = max(left-float64(hits), 0)
	} else if perNano > 0 && float64(hits) <= c {
		d.RetryAfter = max(ceilNanos((float64(hits)-left)/perNano), 1)
	} else {
		d.RetryAfter = s.Window // never fits; a window is an honest "not soon"
	}
	d.Remaining = max(int64(math.Floor(left)), 0)
	if perNano > 0 {
		d.Reset = ceilNanos((c - left) / perNano)
	}
	return d
}

// interval is the GCRA emission interval of hits requests, in nanoseconds.
func (s Spec) interval(hits int64) int64 {
	if s.Limit == 0 {
		return s.Window
	}
	return ceilNanos(float64(hits) * float64(s.Window) / float64(s.Limit))
}

func (s Spec) peekGCRA(st *State, now, hits int64) Decision {
	tau := s.interval(s.Capacity()) // burst tolerance: a full bucket's worth
	tat := max(st.Start, now)
	next := tat + s.interval(hits)
	d := Decision{}
	if s.Limit > 0 && next-now <= tau {
		d.Allowed = true
		tat = next
	} else if s.Limit > 0 && hits <= s.Capacity() {
		d.RetryAfter = max(next-now-tau, 1)
	} else {
		d.RetryAfter = s.Window
	}
	d.Reset = tat - now
	if s.Limit > 0 {
		one := s.interval(1)
		d.Remaining = max((tau-(tat-now))/one, 0)
	}
	return d
}

func (s Spec) peekLog(st *State, now, hits int64) Decision {
	var n int64
	if st.Log != nil {
		n = st.Log.n
	}
	d := Decision{}
	if n+hits <= s.Limit {
		d.Allowed = true
		d.Remaining = s.Limit - n - hits
		d.Reset = s.Window // the hits just admitted leave one window from now
		return d
	}
	d.Remaining = max(s.Limit-n, 0)
	if n > 0 {
		d.Reset = st.Log.newest() + s.Window - now
	}
	if hits > s.Limit || n == 0 {
		d.RetryAfter = max(d.Reset, 1)
		return d
	}
	// The (n+hits−limit)-th oldest hit must leave the window first.
	d.RetryAfter = max(st.Log.at(n+hits-s.Limit-1)+s.Window-now, 1)
	return d
}

// windowStart is the start of the epoch-aligned window of length w holding t.
func windowStart(t, w int64) int64 {
	r := t % w
	if r < 0 {
		r += w
	}
	return t - r
}

// WindowStart is the start of the epoch-aligned window of length w that holds t.
func WindowStart(t, w int64) int64 { return windowStart(t, w) }

func ceilNanos(f float64) int64 {
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(math.Ceil(f))
}
