package store

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// replicated is the part of a Memory store that counts across PoPs: the
// per-window G-counters of limits with scope region or global. This PoP's own
// counts are a crdt.Local (what it publishes), other replicas' a
// crdt.Counters (what it applies). A check of such a limit decides on
// own + remote counts of the current and previous window, and adds admitted
// hits to its own count only.
//
// Windows of different lengths age differently, so each window length has
// its own pair, and sweep drops each pair's windows older than the previous
// one.
type replicated struct {
	mu          sync.Mutex
	self        string
	extrapolate bool // see MemoryConfig.Extrapolate
	inRegion    func(replica string) bool
	units       map[int64]*unitCounts // by window length
	clocks      []*replicaClock       // one per other replica of the topology or heard from; few, so a slice beats a map
	started     bool                  // see start
	// settled holds, when keepSettled, the windows settle judged since
	// they were last taken (takeSettled), for MemoryConfig.SettledExcess.
	settled     []settledWindow
	keepSettled bool
	// esc decides the items with consistency bounded (bounded.go); nil
	// when the replica names do not make a ledger: those items then have
	// no room.
	esc *bounded
}

// stateOf is the State a replicated item decides on at now: the ledger's
// room for a bounded item, else own and remote counts with the estimate.
// Requires r.mu held.
func (r *replicated) stateOf(it *limit.Item, now int64) limit.State {
	if !isBounded(it) {
		return r.state(it, now)
	}
	if r.esc == nil {
		return limit.State{Start: limit.WindowStart(now, it.Spec.Window), Unheard: float64(it.Spec.Limit)}
	}
	return r.esc.state(it, now)
}

// counted records the outcome of a replicated item's decision: admitted
// hits in its counts, a denial at its limit (of a shadow item too when
// shadowAtLimit). It reports whether the hits were counted as admitted.
// Requires r.mu held.
func (r *replicated) counted(it *limit.Item, st *limit.State, now, hits int64, admitted, allowed, shadowAtLimit bool) bool {
	if isBounded(it) {
		if r.esc == nil {
			return false
		}
		return r.esc.settle(it, now, hits, admitted && allowed)
	}
	switch {
	case admitted && allowed:
		r.add(it, st, now, hits)
		return true
	case !allowed && (shadowAtLimit || !it.Shadow):
		r.atLimit(it, st.Start)
	}
	return false
}

// settledWindow is a window settle judged: the limit's scope and how far
// over its limit the window settled, in percent of it.
type settledWindow struct {
	scope limit.Scope
	pct   float64
}

// maxSettled bounds the judged windows kept between two takes: a PoP whose
// news stopped coming (no apply takes them) must not pile them up.
const maxSettled = 1024

// takeSettled returns the windows judged since the last call. Requires r.mu
// held.
func (r *replicated) takeSettled() []settledWindow {
	out := r.settled
	r.settled = nil
	return out
}

// replicaClock is what a PoP knows of how fresh another replica's counts
// are: when the replica stamped the newest message it applied, when that
// message was applied here, the usual time between the replica's messages and
// the usual delay from stamp to apply.
type replicaClock struct {
	name       string
	sent, recv int64
	gap, lag   float64
	// beacon is when its latest presence beacon was applied here, and
	// beaconGap the usual time between two (see held).
	beacon    int64
	beaconGap float64
}

const (
	maxClockGap = int64(time.Second)
	maxClockLag = int64(500 * time.Millisecond)
	// firstNewsSpan caps the span a replica's first news of a key is
	// taken over (guess): the default flush interval, within which a
	// replica reports what it counted anyway.
	firstNewsSpan = float64(100 * time.Millisecond)
	// paceHits is how many hits at this PoP's own pace a replica's first
	// news of a key is taken with (byRate), and paceFloor the least span
	// that pace is taken over (newPace): a few hits say little of a rate.
	// It is taken whether it raises the guess or lowers it: taken only
	// where it raises it, a replica with less demand than this PoP's pace
	// is guessed at it, and this PoP held back (docs/accuracy-log.md,
	// "paceHits and paceFloor").
	paceHits  = 20.0
	paceFloor = int64(50 * time.Millisecond)
	// beforeSlack is how much later than a flush and a delay a replica's
	// first news of a key may come (before): jitter and scheduling.
	beforeSlack = float64(20 * time.Millisecond)
	// lagStep is a change of a replica's stamp-to-apply delay taken for a
	// step of a clock rather than jitter.
	lagStep = float64(50 * time.Millisecond)
	// stallReach is how far past a replica's usual gap the mirror (guess)
	// follows its silence. Deltas ride TCP: a message lost between regions
	// holds everything behind it for a retransmission (≥ 200 ms), and to
	// the PoPs on the other side the stalled replica looks quiet. The
	// replica's own rate cannot tell the two apart, so age stops one gap
	// past the delay; the mirror can, because it guesses from what this
	// PoP admitted meanwhile: if it admitted, the room it found was open to
	// the replica too, stalled or not; if it denied, so did the replica.
	// But there no higher than the replica's own rate over that age (see
	// guess). It is the retransmission floor itself: on links busy with
	// other keys a replica's usual gap is a few ms, not the 100 ms of a
	// flush, and a shorter reach left the last half of every stall
	// unguessed (docs/accuracy-log.md, "stallReach").
	stallReach = float64(200 * time.Millisecond)
	// steadyPace and steadyCap bound the mirror where the room frees as
	// the window slides (see steady): there the mirror guesses high, and
	// the cap trades that against the worst window (docs/accuracy-log.md,
	// "steadyPace and steadyCap").
	steadyPace = 1.5
	steadyCap  = 1.1
	// mirrorEvidence is the least number of hits this PoP must have
	// admitted over the age of a replica's news for the mirror (guess) to
	// scale them by the replica's part of the key: the mirror says the
	// room opened for everyone at once, and one admission cannot say that.
	// A key near its limit but within it (a client at 95 of 100 a minute,
	// its requests Poisson over several PoPs) has this PoP admit one hit
	// in an age now and then, and the mirror took it for the others
	// admitting theirs/ours times as much: four to ten hits guessed of a
	// key that had none to give, and the client denied though it sent no
	// more than its limit. Two, not more: a PoP admits one or two hits an
	// age while the room frees (docs/accuracy-log.md, "mirrorEvidence").
	mirrorEvidence = 2
)

// clock returns the clock of the named replica, or nil. Requires r.mu held.
func (r *replicated) clock(name string) *replicaClock {
	for _, c := range r.clocks {
		if c.name == name {
			return c
		}
	}
	return nil
}

// clockOf returns the clock of the named replica, creating it. Requires
// r.mu held.
func (r *replicated) clockOf(name string) *replicaClock {
	c := r.clock(name)
	if c == nil {
		c = &replicaClock{name: strings.Clone(name)}
		r.clocks = append(r.clocks, c)
	}
	return c
}

// heard records that a message the replica stamped at sent was applied at now.
func (c *replicaClock) heard(now, sent int64) {
	if sent <= c.sent {
		return // an older message, a duplicate, or no stamp
	}
	lag := float64(min(max(now-sent, 0), maxClockLag))
	if c.sent == 0 || math.Abs(lag-c.lag) > lagStep {
		// The first news, or a clock stepped — ours or the replica's, by
		// clock agreement (replication/core) or NTP: its stamps now read
		// differently, and smoothing over the step would spend a dozen
		// messages on ages off by it (300 ms: hundreds of a sprayer's hits
		// guessed that never came, skew's false denials).
		c.lag = lag
	}
	if c.sent != 0 {
		gap := float64(min(sent-c.sent, maxClockGap))
		if c.gap == 0 {
			c.gap = gap
		} else {
			c.gap += (gap - c.gap) / 8
		}
		c.lag += (lag - c.lag) / 8
	}
	c.sent, c.recv = sent, now
}

// sentAt is when, on this PoP's clock, the replica sent the newest message
// of it applied here: its arrival less the usual stamp-to-apply delay.
func (c *replicaClock) sentAt() float64 { return float64(c.recv) - c.lag }

// age is how old, at now, what the replica last told us probably is: the
// stamp-to-apply delay plus the time since, but at most one usual gap and
// reach more than that delay — past the gap, the replica would have sent
// news if it had any and its link were not stalled (see stallReach). While
// no gap is known (one message so far) there is no silence to follow: the
// age is the delay.
func (c *replicaClock) age(now int64, reach float64) float64 {
	if c.gap == 0 {
		reach = 0
	}
	a := float64(now-c.recv) + c.lag
	return min(max(a, 0), c.gap+c.lag+reach)
}

type unitCounts struct {
	own    *crdt.Local
	remote crdt.Counters
	recent map[string]*recentHits // own latest admissions of keys near their limit
}

// recentHits remembers when this PoP admitted its latest hits of one key:
// the running total after each admission, for the last recentLen of them.
type recentHits struct {
	at, total [recentLen]int64
	next, n   int // where the next admission goes, and how many are held
	sum       int64
	from      int64 // when it began to remember: it knows nothing of before
	near      int64 // when the key came near its limit (nearLimit); 0: not yet
	// What settle goes by: the latest two windows (their starts) in which
	// this PoP found the key at its limit; the window whose settled count
	// it last judged; the correction it keeps (in hits); and the
	// PoP's own count as its store last read it, for a PoP of several
	// servers (popCount).
	full, fullPrev int64
	judged         int64
	correction     float64
	popAt          [2]int64
	popN           [2]uint64
	// win is the start of the window of the latest admission; lastBefore
	// is when the latest admission before that window was (0: none
	// remembered), and totalBefore the running total after it (see since).
	win, lastBefore, totalBefore int64
}

const recentLen = 32

// recentIdle is how long a key's recentHits outlive its last admission.
const recentIdle = int64(10 * time.Second)

// add remembers an admission of hits at now, in the window that starts at
// start.
func (r *recentHits) add(now, start, hits int64) {
	if start > r.win {
		r.win = start
		r.lastBefore, r.totalBefore = r.last(), r.sum
	}
	r.sum += hits
	r.at[r.next], r.total[r.next] = now, r.sum
	r.next = (r.next + 1) % recentLen
	r.n = min(r.n+1, recentLen)
}

// since returns how many hits were admitted after t, up to now. When t is
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
func (r *recentHits) since(t, now int64) float64 {
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
func (r *recentHits) last() int64 {
	if r.n == 0 {
		return 0
	}
	return r.at[(r.next-1+recentLen)%recentLen]
}

func newReplicated(self string, regionPeers, replicas []string, extrapolate bool) *replicated {
	r := &replicated{self: self, inRegion: crdt.OneOf(regionPeers...), units: make(map[int64]*unitCounts),
		extrapolate: extrapolate}
	for _, name := range replicas {
		if name != self {
			r.clockOf(name) // not heard yet: held, from the first check on (see start)
		}
	}
	return r
}

// start notes, at the store's first check or apply, when the replicas it
// has not heard from began to be silent: now. Requires r.mu held.
func (r *replicated) start(now int64) {
	r.started = true
	for _, c := range r.clocks {
		if c.recv == 0 {
			c.recv = now
		}
	}
}

// unit returns the counters of window length w, creating them. Requires r.mu held.
func (r *replicated) unit(w int64) *unitCounts {
	u := r.units[w]
	if u == nil {
		u = &unitCounts{own: crdt.NewLocal(r.self), recent: make(map[string]*recentHits)}
		r.units[w] = u
	}
	return u
}

// state is the limit.State a check of item decides on at now: own plus remote
// counts of the current and previous window. Requires r.mu held.
func (r *replicated) state(it *limit.Item, now int64) limit.State {
	if !r.started {
		r.start(now)
	}
	w := it.Spec.Window
	u := r.unit(w)
	start := limit.WindowStart(now, w)
	// A lookup does not retain its key, so the key's bytes may be borrowed.
	key := unsafe.String(unsafe.SliceData(it.Key), len(it.Key))
	in := r.inRegion
	if it.Scope == limit.ScopeGlobal {
		in = nil // every other replica
	}
	// Hash the key once for each table: a check reads three windows.
	ho, hr := u.own.Key(key), u.remote.Key(key)
	count := func(window int64) int64 {
		return int64(u.own.CountOf(ho, window) + u.remote.TotalOf(hr, window, in))
	}
	st := limit.State{Start: start, Cur: count(start), Prev: count(start - w)}
	if it.Shrunk && st.Prev > it.Spec.Limit {
		st.Prev = it.Spec.Limit // see limit.Item.Shrunk
	}
	if r.extrapolate {
		// A replica whose clock is ahead already counts in the next
		// window what happens now: its hits there are this window's too.
		// So do this PoP's own after its clock stepped back across a
		// window boundary (moveClock): they were admitted moments ago.
		st.Cur += int64(u.remote.TotalOf(hr, start+w, in) + u.own.CountOf(ho, start+w))
		// Far from the limit — under an eighth of it heard — a guess at
		// the hits not heard yet changes no decision worth its cost: it
		// would take the others admitting seven times what was heard in
		// one age of their news.
		if 8*(float64(st.Prev)*prevWeight(now, start, w)+float64(st.Cur)+1) > float64(it.Spec.Limit) {
			st.Unheard = r.unheard(u, key, ho, hr, start, w, now, in)
			if rh := u.nearOf(key); rh != nil && settles(it) {
				st.Unheard = max(st.Unheard+r.settle(u, rh, ho, hr, it.Spec.Limit, start, w, now, in), 0)
			}
		}
	}
	return st
}

// unheard estimates the hits of key that other replicas have admitted and
// this PoP has not heard of yet. For each replica, what it admitted since the
// newest message of it we applied, over the age of that message
// (replicaClock.age):
//
//   - When this PoP has itself admitted the key lately (it is near its limit,
//     see add) and did so before that age at least as much as within it, by
//     what it admitted over that same age: the replica saw the same news and
//     decides by the same rule, so it admitted in proportion to its part of
//     the key's traffic (its sliding count then against ours then; a PoP
//     new to the key has no such part to go by). This follows the room as it
//     opens and closes for everyone at once — after a window rolls, a burst,
//     a partition heals — where a rate measured over the window lags a whole
//     window behind and lets every PoP take the same room.
//   - Otherwise, by its rate: its sliding count over the window length, or,
//     when it had none of the key in the previous window, its count over the
//     part of this window before its news.
//
// The part of the age before the window began weighs as the previous window
// does. Replicas whose news is held up count as the ones whose news flows
// (see held). Requires r.mu held.
func (r *replicated) unheard(u *unitCounts, key string, ho, hr crdt.KeyHash, start, w, now int64, in func(string) bool) float64 {
	type rc struct {
		name      string
		cur, prev uint64
		count     float64 // its sliding count plus what guess adds
	}
	var buf [16]rc
	reps := buf[:0]
	find := func(name string) *rc {
		for i := range reps {
			if reps[i].name == name {
				return &reps[i]
			}
		}
		reps = append(reps, rc{name: name})
		return &reps[len(reps)-1]
	}
	u.remote.EachOf(hr, start, in, func(name string, n uint64) { find(name).cur = n })
	u.remote.EachOf(hr, start-w, in, func(name string, n uint64) { find(name).prev = n })
	rh := u.nearOf(key)
	weight := prevWeight(now, start, w)
	var mine float64 // this PoP's sliding count, when it admitted the key lately
	if rh != nil {
		mine = u.ownSliding(ho, start, w, weight)
	}
	pace := u.newPace(ho, rh, start, w, now)
	extra := 0.0
	var held uint64 // bit i: reps[i] is held (see held); the first 64
	for i := range reps {
		c := &reps[i]
		c.count = float64(c.prev)*weight + float64(c.cur)
		if clk := r.clock(c.name); clk != nil {
			g := clk.guess(c.cur, c.prev, start, w, now, rh, mine, pace)
			extra += g
			c.count += g
			if rh != nil && i < 64 && clk.held(now) {
				held |= 1 << i
			}
		}
	}
	if rh == nil || len(reps) == 0 || held == 0 && len(reps) >= len(r.clocks) {
		return extra
	}
	// Replicas held up (see held) count as the ones whose news flows:
	// those that told of the key at least at their mean, those that told
	// nothing at it.
	var all, flowing float64
	n := 0
	for i, c := range reps {
		all += c.count
		if held&(1<<i) == 0 {
			flowing += c.count
			n++
		}
	}
	mean := all / float64(len(reps))
	if n > 0 && n < len(reps) {
		mean = flowing / float64(n)
		for i, c := range reps {
			if held&(1<<i) != 0 && c.count < mean {
				extra += mean - c.count
			}
		}
	}
	if len(reps) < len(r.clocks) {
		for _, clk := range r.clocks {
			if (clk.held(now) || clk.before(rh, now)) && (in == nil || in(clk.name)) && !slices.ContainsFunc(reps, func(c rc) bool { return c.name == clk.name }) {
				extra += mean
			}
		}
	}
	return extra
}

// The settled count's correction (settle).
//
// unheard's guess runs high on purpose where PoPs compete for the room a
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
// in that window, settle steers what it adds to the guess by settleGain of
// how far the count settled outside a band: more than settleSlack under the
// limit, the guess ran high and the correction goes down; over the limit,
// it ran low and the correction goes up; within the band a correction
// below zero gives back what the window shows it need not take off, and
// one above zero stays. It stays within settleBound of the limit either
// way, and a window not at the limit here halves it. Every PoP reads the
// same settled counts, so they move together.
//
// The band is there because per-client keys settle at their limit: aimed
// at the limit less settleSlack both ways, they were pushed under it, and
// with a slack of 0 or 1 the count sat on the limit (docs/accuracy-log.md,
// "settleGain").
//
// Sliding windows only. A fixed window's PoPs overshoot together just after
// it rolls, when all of them find room at once; steered up by that, the
// guess held every PoP short of the limit for the rest of each window
// (docs/accuracy-log.md, "settleGain").
const (
	settleAfter = int64(300 * time.Millisecond)
	settleSlack = 2.0
	settleGain  = 0.3
	settleBound = 0.05
)

// settle returns the correction of the guess of a key near its limit (see
// above), judging the previous window's settled count once per window
// when it is due: settleAfter into this window (half the window for a
// short one), with no replica of the limit's scope held up (its count is
// not settled). A window judged at the limit is kept for SettledExcess.
// Requires r.mu held.
func (r *replicated) settle(u *unitCounts, rh *recentHits, ho, hr crdt.KeyHash, lim, start, w, now int64, in func(string) bool) float64 {
	if rh.judged == start || now-start < min(settleAfter, w/2) {
		return rh.correction
	}
	for _, c := range r.clocks {
		if (in == nil || in(c.name)) && c.held(now) {
			return rh.correction
		}
	}
	rh.judged = start
	prev := start - w
	if rh.full != prev && rh.fullPrev != prev {
		rh.correction /= 2
		return rh.correction
	}
	own := u.own.CountOf(ho, prev)
	if i := (prev / w) & 1; rh.popAt[i] == prev {
		own = max(own, rh.popN[i])
	}
	settled := float64(own + u.remote.TotalOf(hr, prev, in))
	l := float64(lim)
	if r.keepSettled && len(r.settled) < maxSettled {
		sc := limit.ScopeGlobal
		if in != nil {
			sc = limit.ScopeRegion
		}
		r.settled = append(r.settled, settledWindow{sc, 100 * (settled - l) / l})
	}
	switch {
	case settled < l-settleSlack: // the guess ran high
		rh.correction += settleGain * (settled - (l - settleSlack))
	case settled > l: // it ran low
		rh.correction += settleGain * (settled - l)
	case rh.correction < 0: // within the band: give back what need not be taken off
		rh.correction = min(rh.correction+settleGain*(settled-(l-settleSlack)), 0)
	}
	rh.correction = min(max(rh.correction, -settleBound*l), settleBound*l)
	return rh.correction
}

// settles reports whether settle steers the guess of item: a sliding window
// (see settle's constants for why not a fixed one).
func settles(it *limit.Item) bool { return it.Spec.Algorithm == limit.SlidingWindow }

// atLimit notes that this PoP found item's key at its limit in the window
// that starts at start — a check denied it — when it keeps recent hits of
// the key near its limit and settle steers the item. Both stores call it
// on a denial: the embedded store's decides on its estimate, the Redis
// store's on what Redis holds, which for a PoP of several servers is more
// than a server's estimate counts. Requires r.mu held.
func (r *replicated) atLimit(it *limit.Item, start int64) {
	if !r.extrapolate || !settles(it) {
		return
	}
	if u := r.units[it.Spec.Window]; u != nil {
		if rh := u.nearOf(unsafe.String(unsafe.SliceData(it.Key), len(it.Key))); rh != nil {
			rh.reached(start)
		}
	}
}

// reached notes that this PoP found the key at its limit in the window
// that starts at start.
func (rh *recentHits) reached(start int64) {
	if rh.full != start {
		rh.fullPrev, rh.full = rh.full, start
	}
}

// popCount notes the PoP's own count n of a key in the window that starts
// at window (of length w), as a store of several servers read it: the
// settled count must hold every server's hits, and the estimate's own
// count holds this server's only. Requires r.mu held.
func (r *replicated) popCount(w int64, key string, window int64, n uint64) {
	u := r.units[w]
	if u == nil {
		return
	}
	if rh := u.recent[key]; rh != nil {
		i := (window / w) & 1
		if rh.popAt[i] != window {
			rh.popAt[i], rh.popN[i] = window, 0
		}
		rh.popN[i] = max(rh.popN[i], n)
	}
}

// held reports whether the replica's news is held up at now: it has been
// silent for more than twice its usual gap between messages, but not for
// heldMax, and its presence beacons are overdue too; or, never heard from
// (a replica of the topology, MemoryConfig.Replicas), silent since the
// store's first check for not yet heldFirst.
//
// unheard guesses, for each replica that told of a key, what it admitted
// since its news (guess); a replica that told nothing of the key — in
// either window — counts nothing at all. Where it told nothing because its
// news is held up (a lost segment stalls its link for a retransmission,
// ≥ 200 ms; a cut), nothing is the least likely count: a key near its
// limit here is, as a rule, sprayed or spread, and a stalled replica
// probably admitted it as the replicas that told did. So unheard counts
// each such replica at the mean of those: their sliding counts plus what
// it guessed of them. A replica whose news flows and that told nothing
// did not admit the key, and none is guessed for a key no other replica
// told of (one pinned to this PoP) (docs/accuracy-log.md, "held").
//
// A held replica that did tell of the key is no better known: its count
// stopped at what it told before the stall, and its guess stops growing a
// stallReach past its usual gap. So it too counts at least at the mean of
// the replicas whose news flows (when all are held, there is nothing to
// go by and it counts as guessed). Before, a region whose link stalled
// right after its first news of a sprayer (one or two hits told) or a cut's
// other side in the cut's first window counted at what they told and
// little more, for the whole stall. At a price where demand is uneven: a
// light replica held counts at the heavier ones' mean
// (docs/accuracy-log.md, "held").
//
// Past heldMax the replica is gone or cut off for good: the core notices a
// cut region after its unreachable-after (3 s by default) and shrinks the
// region's share of a global limit instead, and a PoP that stopped (a
// single PoP of a region that still beacons) is not counted forever.
//
// A replica whose traffic stopped is silent too, and counted so it took
// half the limit of a key two PoPs shared from PoPs whose clients came and
// went (docs/accuracy-log.md, "held"). A stall holds the replica's beacons
// as well (they ride the same links, in order), and a cut stops them; a
// quiet replica's keep coming, every 500 ms. So a replica is held only while its beacons
// are overdue — half again their usual gap since the last one; or, its
// beacons unknown yet, while none came after its latest news. That takes
// a stall shorter than a beacon interval out of held (the mirror's
// stallReach covers it for the replicas that told of the key) and leaves
// it the cuts and the long stalls.
//
// A replica never heard from is held while its first news could still be
// on the way: a region stalled from the start of a key (a sprayer that
// begins as the PoPs start) tells nothing of its first hits, and the far
// regions' first news is 150 ms away at best. But only for heldFirst: held
// for as long as a heard replica, a replica that never has traffic of its
// own stopped counting in the middle of a busy window and the PoPs all took
// the room it left at once (docs/accuracy-log.md, "held").
func (c *replicaClock) held(now int64) bool {
	silent := float64(now - c.recv)
	if c.sent == 0 {
		return silent > heldMin && silent < heldFirst
	}
	if silent <= max(2*c.gap, heldMin) || silent >= heldMax {
		return false // news flows (the common case: tested first), or the replica is gone
	}
	if c.beaconGap > 0 {
		if float64(now-c.beacon) < 1.5*max(c.beaconGap, beaconFloor) {
			return false
		}
	} else if c.beacon > c.recv {
		return false
	}
	return true
}

// before reports whether the replica's latest news, which told nothing of
// a key, was sent before this PoP began to remember the key (rh) and its
// first news of the key may still be on the way: one flush
// (firstNewsSpan) and its usual delay from then, and beforeSlack. Such a
// replica counts as the ones that told of the key (unheard), as one never
// heard from does (held). A sprayer arriving at PoPs that had been
// running (world-quiet) found the far replicas heard from a few ms
// before, silent of it and so counted as none, for the 150 ms their
// first news took: its first window settled at up to 120 of 100
// (docs/accuracy-log.md, "before").
func (c *replicaClock) before(rh *recentHits, now int64) bool {
	return c.sent != 0 && c.sentAt() < float64(rh.from) &&
		float64(now) < float64(rh.from)+c.lag+firstNewsSpan+beforeSlack
}

// beaconed notes that a presence beacon of the replica was applied at now.
// Gaps under beaconFloor are not the replica's pace: two PoPs that meet
// answer each other's beacons at once, a few ms apart, and taking that for
// their pace held every quiet replica between two beacons.
func (c *replicaClock) beaconed(now int64) {
	if c.beacon != 0 && now > c.beacon {
		if gap := float64(min(now-c.beacon, 10*maxClockGap)); gap >= beaconFloor {
			if c.beaconGap == 0 {
				c.beaconGap = gap
			} else {
				c.beaconGap += (gap - c.beaconGap) / 8
			}
		}
	}
	c.beacon = max(c.beacon, now)
}

// beaconFloor is the least gap between a replica's beacons held takes for
// their pace (the default beacon interval is 500 ms).
const beaconFloor = float64(250 * time.Millisecond)

// Beacon tells the store that a presence beacon of PoP pop arrived now
// (replication.BeaconCounts): see replicated.held.
func (s *Memory) Beacon(pop string) {
	s.BeaconAt(time.Now().UnixNano()+s.clock.Load(), pop)
}

// BeaconAt is Beacon at now (unix ns).
func (s *Memory) BeaconAt(now int64, pop string) {
	if s.rep != nil {
		s.rep.beaconAt(now, pop)
	}
}

// beaconAt notes a beacon of pop at now. Requires r.mu not held.
func (r *replicated) beaconAt(now int64, pop string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pop == r.self {
		return
	}
	r.clockOf(pop).beaconed(now)
}

// heldMin and heldMax bound the silence held takes for a stall; heldFirst
// is heldMax for a replica never heard from: the longest one-way delay
// between continents, a flush and a retransmission.
const (
	heldMin   = float64(20 * time.Millisecond)
	heldMax   = float64(3 * time.Second)
	heldFirst = float64(500 * time.Millisecond)
)

// guess is unheard's estimate for one replica whose news is c, with counts
// cur and prev of key in the windows that start at start and start−w; rh
// and mine are this PoP's recent hits of the key and its sliding count
// (nil and 0 when it did not admit the key lately).
func (c *replicaClock) guess(cur, prev uint64, start, w, now int64, rh *recentHits, mine, pace float64) float64 {
	theirs := float64(prev)*prevWeight(now, start, w) + float64(cur) // its sliding count, weighed now
	age := c.age(now, 0)
	if mine > 0 {
		plain, since, ok := c.mirror(rh, mine, theirs, now, age)
		// capped is the mirror no higher than steadyCap times the
		// replica's own rate (see steady).
		capped := func() float64 { return min(plain, steadyCap*c.byRate(cur, prev, start, w, now, pace, theirs, age)) }
		// One admission in the age is no evidence that the room opened
		// (see mirrorEvidence), and in a key's first window here (pace:
		// none of it in the previous window) no room has opened: it was
		// open from the key's first hit and can only close until the
		// window rolls. The mirror then goes no higher than where the
		// PoP admits at its pace, here and as the stall reach's floor
		// below. In a first window the mirror only took this PoP's
		// chance bursts for everyone's: on the mix, clients 2–50 times
		// over a limit of 100 a minute, in their first second of abuse,
		// denied at 84–96 of the minute's 100 on four to five replicas
		// guessed at 2–5 hits each where they had admitted a hit or
		// less. The mirror is capped there rather than skipped: the
		// guess by rate alone can run higher (docs/accuracy-log.md,
		// "few").
		few := since < mirrorEvidence || pace > 0
		if ok && few {
			plain = capped()
		}
		// The mirror follows a silence up to stallReach past the usual gap
		// (a stalled link), but there to no more than the replica's own
		// rate gives over that age: a replica that admitted a burst of an
		// hourly limit and has been quiet since is not stalled, and the
		// mirror, which scales by its part of the window's hits, guessed
		// it at six times this PoP's latest hit a third of a second later
		// (TestPoPsOnRedisReplicate, 5 runs of 6).
		if reach := c.age(now, stallReach); reach > age {
			if g, _, rok := c.mirror(rh, mine, theirs, now, reach); rok {
				return min(g, max(c.byRate(cur, prev, start, w, now, pace, c.stamped(cur, prev, start, w, now), reach), plain))
			}
		}
		if ok && !few && steady(since, mine, age, w) {
			return capped()
		}
		if ok {
			return plain
		}
	}
	return c.byRate(cur, prev, start, w, now, pace, c.stamped(cur, prev, start, w, now), age)
}

// stamped is the replica's sliding count of a key, with counts cur and prev
// in the windows that start at start and start−w, as it was when it sent
// its news: the previous window weighed as it was then. That is the count
// its rate goes by (byRate). Weighed at now, the previous window has faded
// by the age of the news while the hits that took its place are the ones
// not heard of yet, and the rate came out low by the age's part of the
// window (traced on anycast: the guess of a replica silent 180 ms behind a
// stall fell 20 hits, a fifth, short). The steady cap keeps the count
// weighed now (see steady).
func (c *replicaClock) stamped(cur, prev uint64, start, w, now int64) float64 {
	at := min(int64(c.sentAt()), now)
	return float64(prev)*min(1, prevWeight(at, start, w)) + float64(cur)
}

// steady reports whether this PoP admitted the key over the last age a —
// since hits — at
// no more than steadyPace times its pace over the window (mine in w): the
// room is not opening, it frees as the window slides. There the PoPs
// compete for each freed slot — one that takes it leaves it to no one
// else — so while this PoP admitted, the others admitted less than their
// part, and the mirror, which scales what this PoP admitted by their part,
// guesses high (traced: about half again what their reports then showed).
// So there guess takes the mirror no higher than steadyCap times the
// replica's own rate — by its sliding count weighed now, not as it was at
// its news (stamped, byRate's count elsewhere): steadyCap was measured so.
// Where the room opens — a window rolls, a burst ends, a cut heals — this
// PoP admits faster than its pace, and the mirror, which follows the room
// at once where a rate lags a window behind, is left alone
// (docs/accuracy-log.md, "steadyPace and steadyCap").
func steady(since, mine, a float64, w int64) bool {
	return a > 0 && since/a <= steadyPace*mine/float64(w)
}

// mirror is the guess by what this PoP admitted over age a (see unheard),
// what it admitted then (since), and whether the guess applies: this PoP
// remembers the whole age and admitted before it at least as much as
// within it.
func (c *replicaClock) mirror(rh *recentHits, mine, theirs float64, now int64, a float64) (g, since float64, ok bool) {
	if rh.near > now-int64(a) {
		// It does not remember the whole age as near the limit (the key
		// came near it since): counting only what it admitted since it
		// began took a sprayer's first 100 ms for quiet
		// (docs/accuracy-log.md, "mirror").
		return 0, 0, false
	}
	since = rh.since(now-int64(a), now)
	if then := mine - since; then >= since {
		return since * theirs / then, since, true
	}
	return 0, since, false
}

// byRate is the guess by the replica's own rate over age a: its count over
// the part of this window before its news when it had none of the key in
// the previous window, else its sliding count n over the window.
func (c *replicaClock) byRate(cur, prev uint64, start, w, now int64, pace, n, a float64) float64 {
	if then := c.sentAt() - float64(start); prev == 0 && then > 0 {
		// The replica had none of the key in the previous window: its rate
		// is its count over the part of this window before its news, not
		// over a whole window (which a key that just began, a sprayer's
		// first second above all, is far from having run). The replica
		// sends news right after it admits a hit, so its count at the stamp
		// is n hits in a span that ends with the n-th: n−1 of them fill the
		// span and the n-th ends it, so it counts half. Counting it whole
		// guessed a replica's second hit at twice its rate and denied a
		// sprayer below its limit; not at all took a replica's first hit
		// for no rate (docs/accuracy-log.md, "byRate").
		//
		// The span is at least the replica's usual gap between messages,
		// so that a replica's first news a few ms into a window is not
		// taken for a rate of hundreds a second; but at most
		// firstNewsSpan: a replica that was quiet before this key (its
		// messages came a second apart) says nothing of the key's rate,
		// and dividing by that second guessed a sprayer at a tenth of
		// its rate (docs/accuracy-log.md, "byRate").
		//
		// While the key is new to this PoP too, the replica's count is
		// taken with paceHits more hits at this PoP's own pace since the
		// key's onset (newPace): a few hits say little of a rate, and a
		// sprayer's far replicas told of their first one to three while
		// the key filled. Graded alone, those counts guessed the sprayer's
		// first window short at the PoPs furthest away
		// (docs/accuracy-log.md, "byRate"). With more
		// hits the replica's own count prevails; a replica whose demand
		// differs from this PoP's is taken closer to this PoP's pace
		// until it has told of a score of hits.
		span := max(then, min(c.gap, firstNewsSpan))
		if pace > 0 {
			return (float64(cur) - 0.5 + paceHits) / (span + paceHits/pace) * a
		}
		return (float64(cur) - 0.5) / span * a
	}
	rate := n / float64(w) // hits per ns
	inCur := min(a, float64(now-start))
	return rate*inCur + rate*(a-inCur)*prevWeight(now, start, w)
}

// prevWeight is how much of the previous window the sliding estimate counts
// at now, in the window of length w that starts at start.
func prevWeight(now, start, w int64) float64 { return float64(w-(now-start)) / float64(w) }

// newPace is this PoP's rate of a key new to it (hits a ns): with none of
// it in the previous window, its hits since it began to remember the key
// (rh, near its limit) when that was in this window at least paceFloor
// ago, the first of them ending the span and counted half; 0 otherwise.
// It stands for the key's rate at the replicas that have told little of it
// yet (byRate). Taken over the window before the key began here, or over
// less than paceFloor, it says little of the key's rate: a PoP whose first
// hits of a key came in one burst 900 ms into a window put a replica that
// had told of 80 hits at half its rate (TestExtrapolationDenies).
func (u *unitCounts) newPace(ho crdt.KeyHash, rh *recentHits, start, w, now int64) float64 {
	if rh == nil || rh.from <= start || now-rh.from < paceFloor || u.own.CountOf(ho, start-w) != 0 {
		return 0
	}
	return (float64(rh.sum) - 0.5) / float64(now-rh.from)
}

// ownSliding is this PoP's sliding count of the key hashed k, the previous
// window weighed by weight.
func (u *unitCounts) ownSliding(k crdt.KeyHash, start, w int64, weight float64) float64 {
	return float64(u.own.CountOf(k, start-w))*weight + float64(u.own.CountOf(k, start))
}

// A key is near its limit from 1/nearLimit of it (a quarter) counted: from
// then this PoP guesses what the others admitted of it (unheard, with what
// it remembers admitting: recentHits), and it is hot (Hot). A key with no
// count in the previous window — new, or back after a quiet window — is
// remembered already from 1/nearLimitNew of it (a 32nd), though near only
// from a quarter: such a key is as a rule a client that has just begun, and
// when the agreed clock steps this PoP across a window boundary in its
// first second (moveClock), the hits admitted since the new window began
// must be counted in it too, which only remembered ones can be. With the
// sprayer's key remembered from a quarter only, skew's clocks stepped
// before any PoP had come near, and each PoP's hits of the new window were
// forgotten with the old one. The early memory serves the step alone; near
// from a 32nd as well, it moved the whole estimate of a new key, for the
// worse in places (docs/accuracy-log.md, "nearLimitNew").
const (
	nearLimit    = 4.0
	nearLimitNew = 32.0
)

// add counts hits of item in the window st starts. Requires r.mu held.
func (r *replicated) add(it *limit.Item, st *limit.State, now, hits int64) {
	u := r.unit(it.Spec.Window)
	u.own.AddBytes(it.Key, st.Start, uint64(hits))
	if !r.extrapolate {
		return
	}
	key := unsafe.String(unsafe.SliceData(it.Key), len(it.Key))
	rh := u.recent[key]
	near := nearLimit*(float64(st.Cur+st.Prev)+st.Unheard) >= float64(it.Spec.Limit)
	if rh == nil {
		if !near && (st.Prev != 0 || nearLimitNew*(float64(st.Cur)+st.Unheard) < float64(it.Spec.Limit)) {
			return // far from the limit: not worth the memory
		}
		rh = &recentHits{from: now}
		u.recent[string(it.Key)] = rh
	}
	if near && rh.near == 0 {
		rh.near = now
	}
	rh.add(now, st.Start, hits)
}

// nearOf returns the recent hits of key in u when the key is near its limit
// (recentHits.near), else nil. Requires r.mu held.
func (u *unitCounts) nearOf(key string) *recentHits {
	if rh := u.recent[key]; rh != nil && rh.near != 0 {
		return rh
	}
	return nil
}

// moveClock takes a step d of the clock the PoP decides on (the PoPs'
// clock agreement moved it), now being the new clock. The hits already
// counted keep their windows, but the times this PoP remembers shift with
// the clock: its recent admissions and when it applied each replica's news.
//
// A step forward across a window boundary also moves where hits fall: the
// own hits of a key admitted in what the new clock calls the new window
// were counted in the old one, where a sliding count weighs them as the
// previous window's and forgets them as it slides — up to a whole window
// before they are a window old (skew: a PoP 300 ms behind counted a
// sprayer's first 100 ms in the window before and let them go over the
// next second, 10% over the limit). So for each key near its limit (add
// keeps its admission times) the hits admitted since the new window began
// are counted in it too. The old window's count cannot be lowered (a
// replica never publishes less), so they count twice while it weighs:
// from twice at the step down to once at the window's end — the safe side.
// (A step back needs nothing here: state counts own hits of the next
// window as current.) Requires r.mu not held.
func (r *replicated) moveClock(now, d int64) {
	if d == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for w, u := range r.units {
		start, was := limit.WindowStart(now, w), limit.WindowStart(now-d, w)
		for k, rh := range u.recent {
			if start > was {
				// Admitted since the new window began: after start−d by
				// the old clock the ring's times are on.
				moved := min(rh.since(start-d, now-d), float64(u.own.Count(k, was)))
				if n := uint64(moved); n > 0 {
					u.own.Add(k, start, n)
				}
			}
			rh.shift(d)
		}
	}
	for _, c := range r.clocks {
		if c.recv != 0 { // 0: not started (see start)
			c.recv += d
		}
		if c.beacon != 0 {
			c.beacon += d
		}
	}
}

// shift moves the times r remembers by d: the clock they are on stepped.
func (r *recentHits) shift(d int64) {
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

// sweep drops, for every window length, the windows before the previous one.
func (r *replicated) sweep(now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.esc != nil {
		r.esc.region.Prune(now)
		r.esc.global.Prune(now)
	}
	for w, u := range r.units {
		horizon := limit.WindowStart(now, w) - w
		u.own.DropBefore(horizon)
		u.remote.DropBefore(horizon)
		for k, rh := range u.recent {
			// Only the last age of news (well under a second) is ever
			// read; an idle key's admissions cost memory for nothing.
			if now-rh.last() > recentIdle {
				delete(u.recent, k)
			}
		}
	}
}

// admitted signals Urgent after a hit of a replicated limit was admitted.
func (s *Memory) admitted() {
	select {
	case s.urgent <- struct{}{}:
	default:
	}
}

// Urgent returns a channel that receives (without blocking a check, so
// several admissions may make one receive) after a check admitted a hit of a
// region or global limit, or decided a bounded one, and after another PoP
// was heard short of bounded allowance this one can give
// (escrow.Ledger.Wanted): news the other PoPs need before the next flush.
// Replication publishes the delta at once, at most once per its bits
// interval (replication.UrgentNotifier). Publishing every admission within
// 10 ms rather than 100 ms measured best at world scale, for about 2% more
// bytes on the wire on the 270,000-key mix (docs/accuracy-log.md).
func (s *Memory) Urgent() <-chan struct{} { return s.urgent }

// replicates reports whether s counts it across PoPs.
func (s *Memory) replicates(it *limit.Item) bool {
	return s.rep != nil && it.Scope != limit.ScopePOP && it.Spec.Algorithm.Replicable()
}

// checkMany is CheckAt for several items, or a replicated one: it locks the
// shards of the table items in order (and the replicated counts when an item
// replicates), so that the whole check is one atomic step.
func (s *Memory) checkMany(now, hits int64, items []limit.Item, out []limit.Decision) {
	if len(items) == 1 && s.replicates(&items[0]) { // no shard, and no state on the heap
		s.rep.mu.Lock()
		st := s.rep.stateOf(&items[0], now)
		states := [1]*limit.State{&st}
		admitted := limit.Decide(now, hits, items, states[:], out)
		if s.rep.counted(&items[0], &st, now, hits, admitted, out[0].Allowed, true) || isBounded(&items[0]) {
			s.admitted() // a bounded denial's demand is news too: allowance moves to it
		}
		s.rep.mu.Unlock()
		return
	}
	var (
		hashBuf  [maxInline]uint64
		orderBuf [maxInline]int
		stateBuf [maxInline]*limit.State
		tempBuf  [maxInline]limit.State
	)
	hashes, order, states := hashBuf[:0], orderBuf[:0], stateBuf[:0]
	temps := tempBuf[:0]
	if len(items) > maxInline {
		temps = make([]limit.State, 0, len(items)) // pointers into temps must not move
	}
	replicated := false
	for i := range items {
		if s.replicates(&items[i]) {
			hashes = append(hashes, 0) // 0: counted in s.rep, not in a shard
			replicated = true
			continue
		}
		h := s.hash(items[i].Key)
		hashes = append(hashes, h)
		order = append(order, int(h>>56))
	}
	order = sortedUnique(order)
	for _, si := range order {
		s.shards[si].mu.Lock()
	}
	if replicated {
		s.rep.mu.Lock()
	}
	// Find or make every slot first, marked in use; then take pointers, which
	// no later insert in the same shard can move.
	for i, h := range hashes {
		if h != 0 {
			sh := &s.shards[h>>56]
			if j := sh.get(s, h, items[i].Key, now); j >= 0 {
				sh.t.slots[j].idleAt = inUse
			}
		}
	}
	for i, h := range hashes {
		if h == 0 {
			temps = append(temps, s.rep.stateOf(&items[i], now))
			states = append(states, &temps[len(temps)-1])
			continue
		}
		t := &s.shards[h>>56].t
		if j := t.find(h); j >= 0 {
			states = append(states, &t.slots[j].st)
		} else {
			temps = append(temps, limit.State{}) // untracked: see shard.get
			states = append(states, &temps[len(temps)-1])
		}
	}
	admitted := limit.Decide(now, hits, items, states, out)
	for i, h := range hashes {
		if h == 0 {
			if s.rep.counted(&items[i], states[i], now, hits, admitted, out[i].Allowed, false) || isBounded(&items[i]) {
				s.admitted()
			}
			continue
		}
		t := &s.shards[h>>56].t
		if j := t.find(h); j >= 0 {
			t.slots[j].idleAt = items[i].Spec.IdleAt(states[i])
			if s.durable && admitted && out[i].Allowed && hits > 0 {
				s.noteChanged(int(h>>56), h)
			}
		}
	}
	if replicated {
		s.rep.mu.Unlock()
	}
	for i := len(order) - 1; i >= 0; i-- {
		s.shards[order[i]].mu.Unlock()
	}
}

// The methods below make a Memory store with a replica name a
// replication.Counts (cmd wires them; pop does not import replication).

// Delta returns this PoP's own replicated slots changed since the last call.
func (s *Memory) Delta() []crdt.Slot {
	return s.collect(func(u *unitCounts) []crdt.Slot { return u.own.Delta() })
}

// Own returns every own replicated slot.
func (s *Memory) Own() []crdt.Slot {
	return s.collect(func(u *unitCounts) []crdt.Slot { return u.own.Slots() })
}

// DeltaAt is Delta at now (unix ns, the clock checks decide on), with the
// bounded limits' counters that changed: their allowances move toward
// demand first (bounded.go). The replication core calls it each flush.
func (s *Memory) DeltaAt(now int64) []crdt.Slot {
	out := s.Delta()
	if s.rep != nil && s.rep.esc != nil {
		s.rep.mu.Lock()
		out = append(out, s.rep.esc.flush(now)...)
		s.rep.mu.Unlock()
	}
	return out
}

// OwnAt is Own at now, with every own counter of the bounded limits and a
// watermark at now (bounded.go): a snapshot.
func (s *Memory) OwnAt(now int64) []crdt.Slot {
	out := s.Own()
	if s.rep != nil && s.rep.esc != nil {
		s.rep.mu.Lock()
		out = append(out, s.rep.esc.own(now)...)
		s.rep.mu.Unlock()
	}
	return out
}

// Remote returns every slot of other replicas.
func (s *Memory) Remote() []crdt.Slot {
	return s.collect(func(u *unitCounts) []crdt.Slot { return u.remote.Slots() })
}

func (s *Memory) collect(f func(*unitCounts) []crdt.Slot) []crdt.Slot {
	if s.rep == nil {
		return nil
	}
	s.rep.mu.Lock()
	defer s.rep.mu.Unlock()
	ws := make([]int64, 0, len(s.rep.units))
	for w := range s.rep.units {
		ws = append(ws, w)
	}
	slices.Sort(ws) // a deterministic order
	var out []crdt.Slot
	for _, w := range ws {
		out = append(out, f(s.rep.units[w])...)
	}
	return out
}

// Hot returns those of slots (this PoP's own, as Delta returns them) whose
// keys this PoP admits near their limit — the keys whose news the other
// PoPs guess at, and the only ones worth a second copy on the direct path
// between regions (replication.HotCounts). It returns nil without an
// estimate (Extrapolate off). It holds the lock checks of replicated items
// take while it looks each slot's key up.
func (s *Memory) Hot(slots []crdt.Slot) []crdt.Slot {
	if s.rep == nil {
		return nil
	}
	return s.rep.hot(slots)
}

// hot is Hot for either store: a key is near its limit while this PoP
// remembers its recent admissions (add).
func (r *replicated) hot(slots []crdt.Slot) []crdt.Slot {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []crdt.Slot
	for _, sl := range slots {
		for _, u := range r.units {
			if u.nearOf(sl.Key) != nil {
				out = append(out, sl)
				break
			}
		}
	}
	return out
}

// Restore raises own counts to slots after a restart; it never lowers one.
// Slots of other replicas, and keys whose window cannot be told, are ignored.
func (s *Memory) Restore(own []crdt.Slot) {
	if s.rep != nil && s.rep.esc != nil {
		s.rep.mu.Lock()
		own, _ = s.rep.esc.apply(own, 0) // a ledger joins its own counters as any
		s.rep.mu.Unlock()
	}
	s.route(own, func(u *unitCounts, sl []crdt.Slot) { u.own.Restore(sl...) }, true)
}

// Apply joins other replicas' slots, stamped by their sender at sent (unix
// ns, 0 when unknown), into the remote counts, as applied now. Own slots, and
// keys whose window cannot be told (not built by rules.AppendKey), are
// ignored.
func (s *Memory) Apply(sent int64, remote []crdt.Slot) {
	s.ApplyAt(time.Now().UnixNano()+s.clock.Load(), sent, remote)
}

// SetClockOffset makes Apply take the wall clock plus d as the time of
// applying: the clock the engine decides on (pop.Engine.SetClockOffset).
// It also takes the step from the offset before (MoveClock).
func (s *Memory) SetClockOffset(d time.Duration) {
	if old := s.clock.Swap(int64(d)); old != int64(d) {
		s.MoveClock(time.Now().UnixNano()+int64(d), int64(d)-old)
	}
}

// MoveClock tells the store that the clock it decides on stepped by d
// (ns), now (unix ns) being the new clock: see replicated.moveClock. A
// driver with its own clock (the simulator) calls it where SetClockOffset
// would.
func (s *Memory) MoveClock(now, d int64) {
	if s.rep != nil {
		s.rep.moveClock(now, d)
	}
}

// ApplyAt is Apply at now (unix ns): the stamp and the time of applying tell
// how old each sender's news is (see MemoryConfig.Extrapolate).
func (s *Memory) ApplyAt(now, sent int64, remote []crdt.Slot) {
	if s.rep == nil {
		return
	}
	var misses []estimateMiss
	var settled []settledWindow
	// One step under the lock: a check sees the counts and how old they
	// are together, never new counts with an old age or the reverse.
	s.rep.mu.Lock()
	if s.rep.esc != nil {
		var wanted bool
		if remote, wanted = s.rep.esc.apply(remote, sent); wanted {
			s.admitted() // a starved PoP asked for allowance this one can give: flush now
		}
	}
	if s.onMiss != nil {
		misses = s.rep.misses(remote, now, sent)
	}
	s.rep.applyLocked(now, sent, remote)
	if s.onSettled != nil {
		settled = s.rep.takeSettled()
	}
	s.rep.mu.Unlock()
	for _, m := range misses {
		s.onMiss(m.scope, m.hits)
	}
	for _, w := range settled {
		s.onSettled(w.scope, w.pct)
	}
}

// applyLocked joins remote, stamped by their sender at sent, into the
// remote counts as applied now, and notes how old each sender's news is.
// Requires r.mu held.
func (r *replicated) applyLocked(now, sent int64, remote []crdt.Slot) {
	if !r.started {
		r.start(now)
	}
	r.routeLocked(remote, func(u *unitCounts, sl []crdt.Slot) { u.remote.Join(sl...) }, false)
	last := ""
	for i := range remote {
		if name := remote[i].Replica; name != last && name != r.self {
			last = name
			r.clockOf(name).heard(now, sent)
		}
	}
}

// estimateMiss is how far this PoP's estimate of another replica's count of
// a key was from the count the replica then reported.
type estimateMiss struct {
	scope limit.Scope
	hits  float64 // estimate − reported: > 0 overestimated
}

// misses grades the estimate against remote, slots just received, stamped
// at sent and not yet joined: for each slot of the current window of a key
// this PoP estimates closely (it admitted it lately, see add), what the PoP
// held of the replica plus its guess of what the replica admitted since, up
// to the report's stamp, against what the replica reports. Requires r.mu
// held, and the replica clocks not yet told of remote.
func (r *replicated) misses(remote []crdt.Slot, now, sent int64) []estimateMiss {
	var out []estimateMiss
	for i := range remote {
		sl := &remote[i]
		if sl.Replica == r.self {
			continue
		}
		wd, ok := rules.KeyWindow(sl.Key)
		if !ok {
			continue
		}
		w := int64(wd)
		u := r.units[w]
		if u == nil || len(u.recent) == 0 {
			continue
		}
		rh := u.nearOf(sl.Key)
		clk := r.clock(sl.Replica)
		start := limit.WindowStart(now, w)
		if rh == nil || clk == nil || sl.Window != start || sent <= clk.sent {
			// Not a key it estimates closely, or news no newer than what
			// it holds: a second copy (the direct path's, a duplicate)
			// or a message overtaken.
			continue
		}
		scope, _ := rules.KeyScope(sl.Key)
		weight := prevWeight(now, start, w)
		ho := u.own.Key(sl.Key)
		mine := u.ownSliding(ho, start, w, weight)
		cur := u.remote.Replica(sl.Key, start, sl.Replica)
		prev := u.remote.Replica(sl.Key, start-w, sl.Replica)
		if sl.Count < cur {
			continue // older news than what is held
		}
		g := clk.guess(cur, prev, start, w, now, rh, mine, u.newPace(ho, rh, start, w, now))
		// The guess runs to now; the report, to when the replica stamped
		// it, one network delay ago. Graded against the report as it was,
		// the estimate read as overestimated by what the replica admitted
		// on the way: +9.9 hits a report on anycast, +2.6 once the second
		// copies were left out, where the part of the guess up to the
		// stamp reads +0.06. That part is taken in proportion to the time:
		// the span from the held news's stamp to the report's (both on the
		// replica's clock) over the age the guess covers.
		if a := clk.age(now, 0); a > 0 {
			g *= min(float64(sent-clk.sent)/a, 1)
		}
		est := float64(cur) + g
		out = append(out, estimateMiss{scope: scope, hits: est - float64(sl.Count)})
	}
	return out
}

func (s *Memory) route(slots []crdt.Slot, f func(*unitCounts, []crdt.Slot), own bool) {
	if s.rep == nil {
		return
	}
	s.rep.mu.Lock()
	defer s.rep.mu.Unlock()
	s.rep.routeLocked(slots, f, own)
}

// routeLocked is Memory.route with r.mu held.
func (r *replicated) routeLocked(slots []crdt.Slot, f func(*unitCounts, []crdt.Slot), own bool) {
	// Hand f runs of consecutive slots of one window length, not one slot
	// at a time: Counters.Join works a large batch far faster than its
	// slots one by one (it reads ahead, or sweeps its tables in order).
	var (
		run     *unitCounts
		runFrom int
	)
	flush := func(to int) {
		if run != nil && to > runFrom {
			f(run, slots[runFrom:to])
		}
		run = nil
	}
	for i := range slots {
		sl := &slots[i]
		if (sl.Replica == r.self) != own {
			flush(i)
			continue
		}
		w, ok := rules.KeyWindow(sl.Key)
		if !ok {
			flush(i)
			continue
		}
		if u := r.unit(int64(w)); u != run {
			flush(i)
			run, runFrom = u, i
		}
	}
	flush(len(slots))
}
