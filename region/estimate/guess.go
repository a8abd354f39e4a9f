package estimate

import "slices"

// Key is this PoP's side of the estimate of one key at an instant: the
// instant, the key's current window, and what this PoP itself admitted of
// it.
type Key struct {
	Now    int64 // the instant of the estimate (unix ns)
	Start  int64 // when the key's current window began (unix ns)
	Window int64 // the window's length (ns)
	// Recent is this PoP's memory of its admissions of the key when the
	// key is near its limit (Recent.Near), else nil: this PoP did not
	// admit it lately.
	Recent *Recent
	// Own and OwnPrev are this PoP's own counts of the key in the current
	// and the previous window. They are read only with Recent.
	Own, OwnPrev uint64
}

// Count is one other replica's counts of a key, as this PoP heard them: of
// the current window and of the previous one.
type Count struct {
	Name      string
	Cur, Prev uint64
}

// Unheard estimates the hits of a key that other replicas have admitted and
// this PoP has not heard of yet, from reps, the counts heard of it from the
// replicas of its scope (in; nil: every replica), and clocks, the clocks of
// every other replica. For each replica, what it admitted since the newest
// message of it we applied, over the age of that message (Clock.Age):
//
//   - When this PoP has itself admitted the key lately (it is near its limit,
//     see NearLimit) and did so before that age at least as much as within it, by
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
// (see held).
func Unheard(k Key, reps []Count, clocks []*Clock, in func(name string) bool) float64 {
	rh, start, w, now := k.Recent, k.Start, k.Window, k.Now
	weight := PrevWeight(now, start, w)
	var mine float64 // this PoP's sliding count, when it admitted the key lately
	if rh != nil {
		mine = ownSliding(k.Own, k.OwnPrev, weight)
	}
	pace := newPace(rh, k.OwnPrev, start, now)
	var buf [16]float64
	counts := buf[:0] // counts[i]: reps[i]'s sliding count plus what guess adds
	extra := 0.0
	var held uint64 // bit i: reps[i] is held (see held); the first 64
	for i := range reps {
		c := &reps[i]
		count := float64(c.Prev)*weight + float64(c.Cur)
		if clk := Lookup(clocks, c.Name); clk != nil {
			g := clk.guess(c.Cur, c.Prev, start, w, now, rh, mine, pace)
			extra += g
			count += g
			if rh != nil && i < 64 && clk.held(now) {
				held |= 1 << i
			}
		}
		counts = append(counts, count)
	}
	if rh == nil || len(reps) == 0 || held == 0 && len(reps) >= len(clocks) {
		return extra
	}
	// Replicas held up (see held) count as the ones whose news flows:
	// those that told of the key at least at their mean, those that told
	// nothing at it.
	var all, flowing float64
	n := 0
	for i, c := range counts {
		all += c
		if held&(1<<i) == 0 {
			flowing += c
			n++
		}
	}
	mean := all / float64(len(reps))
	if n > 0 && n < len(reps) {
		mean = flowing / float64(n)
		for i, c := range counts {
			if held&(1<<i) != 0 && c < mean {
				extra += mean - c
			}
		}
	}
	if len(reps) < len(clocks) {
		// The key's onset, for replicas whose news of it may still be on
		// the way (before): when this PoP began to remember it, or, when
		// this PoP or a replica counted it in the previous window, no
		// later than this window's start. A key counted before this
		// window is not new, whenever it came to this PoP: a client that
		// moves to this PoP mid-window (moving.yaml) brings a key the
		// others have had half a window and more to tell of, and counted
		// as the replica that told (its whole sliding count each), the
		// ones that told nothing made this PoP deny the client it had just
		// taken over for a quarter of a second, then admit the window's
		// room late, where the next window's estimate lets it through.
		onset := rh.from
		if k.OwnPrev != 0 || slices.ContainsFunc(reps, func(c Count) bool { return c.Prev != 0 }) {
			onset = min(onset, start)
		}
		for _, clk := range clocks {
			if (clk.held(now) || clk.before(onset, now)) && (in == nil || in(clk.name)) && !slices.ContainsFunc(reps, func(c Count) bool { return c.Name == clk.name }) {
				extra += mean
			}
		}
	}
	return extra
}

// Guess is Unheard's estimate for the one replica whose news is c, with
// counts cur and prev of the key in k's current and previous window.
func (c *Clock) Guess(k Key, cur, prev uint64) float64 {
	var mine float64
	if k.Recent != nil {
		mine = ownSliding(k.Own, k.OwnPrev, PrevWeight(k.Now, k.Start, k.Window))
	}
	pace := newPace(k.Recent, k.OwnPrev, k.Start, k.Now)
	return c.guess(cur, prev, k.Start, k.Window, k.Now, k.Recent, mine, pace)
}

// guess is Unheard's estimate for one replica whose news is c, with counts
// cur and prev of key in the windows that start at start and start−w; rh
// and mine are this PoP's recent hits of the key and its sliding count
// (nil and 0 when it did not admit the key lately), pace its pace of a key
// new to it (newPace).
func (c *Clock) guess(cur, prev uint64, start, w, now int64, rh *Recent, mine, pace float64) float64 {
	theirs := float64(prev)*PrevWeight(now, start, w) + float64(cur) // its sliding count, weighed now
	age := c.age(now, 0)
	if mine > 0 {
		plain, since, ok := c.mirror(rh, mine, theirs, now, age)
		// capped is the mirror no higher than SteadyCap times the
		// replica's own rate (see steady).
		capped := func() float64 { return min(plain, SteadyCap*c.byRate(cur, prev, start, w, now, pace, theirs, age)) }
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
		// The mirror follows a silence up to StallReach past the usual gap
		// (a stalled link), but there to no more than the replica's own
		// rate gives over that age: a replica that admitted a burst of an
		// hourly limit and has been quiet since is not stalled, and the
		// mirror, which scales by its part of the window's hits, guessed
		// it at six times this PoP's latest hit a third of a second later
		// (TestPoPsOnRedisReplicate, 5 runs of 6).
		if reach := c.age(now, StallReach); reach > age {
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
func (c *Clock) stamped(cur, prev uint64, start, w, now int64) float64 {
	at := min(int64(c.sentAt()), now)
	return float64(prev)*min(1, PrevWeight(at, start, w)) + float64(cur)
}

// steady reports whether this PoP admitted the key over the last age a —
// since hits — at
// no more than steadyPace times its pace over the window (mine in w): the
// room is not opening, it frees as the window slides. There the PoPs
// compete for each freed slot — one that takes it leaves it to no one
// else — so while this PoP admitted, the others admitted less than their
// part, and the mirror, which scales what this PoP admitted by their part,
// guesses high (traced: about half again what their reports then showed).
// So there guess takes the mirror no higher than SteadyCap times the
// replica's own rate — by its sliding count weighed now, not as it was at
// its news (stamped, byRate's count elsewhere): SteadyCap was measured so.
// Where the room opens — a window rolls, a burst ends, a cut heals — this
// PoP admits faster than its pace, and the mirror, which follows the room
// at once where a rate lags a window behind, is left alone
// (docs/accuracy-log.md, "steadyPace and steadyCap").
func steady(since, mine, a float64, w int64) bool {
	return a > 0 && since/a <= steadyPace*mine/float64(w)
}

// mirror is the guess by what this PoP admitted over age a (see Unheard),
// what it admitted then (since), and whether the guess applies: this PoP
// remembers the whole age and admitted before it at least as much as
// within it.
func (c *Clock) mirror(rh *Recent, mine, theirs float64, now int64, a float64) (g, since float64, ok bool) {
	if rh.near > now-int64(a) {
		// It does not remember the whole age as near the limit (the key
		// came near it since): counting only what it admitted since it
		// began took a sprayer's first 100 ms for quiet
		// (docs/accuracy-log.md, "mirror").
		return 0, 0, false
	}
	since = rh.Since(now-int64(a), now)
	if then := mine - since; then >= since {
		return since * theirs / then, since, true
	}
	return 0, since, false
}

// byRate is the guess by the replica's own rate over age a: its count over
// the part of this window before its news when it had none of the key in
// the previous window, else its sliding count n over the window.
func (c *Clock) byRate(cur, prev uint64, start, w, now int64, pace, n, a float64) float64 {
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
		// FirstNewsSpan: a replica that was quiet before this key (its
		// messages came a second apart) says nothing of the key's rate,
		// and dividing by that second guessed a sprayer at a tenth of
		// its rate (docs/accuracy-log.md, "byRate").
		//
		// While the key is new to this PoP too, the replica's count is
		// taken with PaceHits more hits at this PoP's own pace since the
		// key's onset (newPace): a few hits say little of a rate, and a
		// sprayer's far replicas told of their first one to three while
		// the key filled. Graded alone, those counts guessed the sprayer's
		// first window short at the PoPs furthest away
		// (docs/accuracy-log.md, "byRate"). With more
		// hits the replica's own count prevails; a replica whose demand
		// differs from this PoP's is taken closer to this PoP's pace
		// until it has told of a score of hits.
		span := max(then, min(c.gap, FirstNewsSpan))
		if pace > 0 {
			return (float64(cur) - 0.5 + PaceHits) / (span + PaceHits/pace) * a
		}
		return (float64(cur) - 0.5) / span * a
	}
	rate := n / float64(w) // hits per ns
	inCur := min(a, float64(now-start))
	return rate*inCur + rate*(a-inCur)*PrevWeight(now, start, w)
}

// PrevWeight is how much of the previous window the sliding estimate counts
// at now, in the window of length w that starts at start.
func PrevWeight(now, start, w int64) float64 { return float64(w-(now-start)) / float64(w) }

// newPace is this PoP's rate of a key new to it (hits a ns): with none of
// it in the previous window (its own count there, ownPrev, is 0), its hits
// since it began to remember the key (rh, near its limit) when that was in
// this window at least paceFloor ago, the first of them ending the span and
// counted half; 0 otherwise.
// It stands for the key's rate at the replicas that have told little of it
// yet (byRate). Taken over the window before the key began here, or over
// less than paceFloor, it says little of the key's rate: a PoP whose first
// hits of a key came in one burst 900 ms into a window put a replica that
// had told of 80 hits at half its rate (TestExtrapolationDenies).
func newPace(rh *Recent, ownPrev uint64, start, now int64) float64 {
	if rh == nil || rh.from <= start || now-rh.from < paceFloor || ownPrev != 0 {
		return 0
	}
	return (float64(rh.sum) - 0.5) / float64(now-rh.from)
}

// ownSliding is this PoP's sliding count of a key it counted own and
// ownPrev of in the current and previous window, the previous window
// weighed by weight.
func ownSliding(own, ownPrev uint64, weight float64) float64 {
	return float64(ownPrev)*weight + float64(own)
}

// Counted is an estimate of unheard hits as a decision takes it: a guess of
// less than half a hit is none. Hits are admitted whole, and such a guess —
// the few hundredths of a hit that an idle replica's rate over an hour's
// window times the age of its last snapshot comes to — is the chance that
// one was admitted, less than even. Taken as it is, it withheld a limit's
// last hit for as long as any rate was guessed: on a limit of an hour, the
// whole hour after a client paused one hit short of it, at every PoP, while
// every replica's news said it admitted nothing more. A larger guess is
// taken as it is: there the estimate follows traffic that is really
// arriving, and rounding it moved the worst windows of sprays by chance
// either way.
func Counted(unheard float64) float64 {
	if unheard < 0.5 {
		return 0
	}
	return unheard
}
