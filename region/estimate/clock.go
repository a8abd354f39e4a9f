package estimate

import (
	"math"
	"time"
)

// Clock is what a PoP knows of how fresh another replica's counts are: when
// the replica stamped the newest message it applied, when that message was
// applied here, the usual time between the replica's messages and the
// usual delay from stamp to apply. Make one with NewClock. It is not safe
// for concurrent use.
type Clock struct {
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
	// FirstNewsSpan caps the span a replica's first news of a key is
	// taken over (guess): the default flush interval, within which a
	// replica reports what it counted anyway.
	FirstNewsSpan = float64(100 * time.Millisecond)
	// PaceHits is how many hits at this PoP's own pace a replica's first
	// news of a key is taken with (byRate), and paceFloor the least span
	// that pace is taken over (newPace): a few hits say little of a rate.
	// It is taken whether it raises the guess or lowers it: taken only
	// where it raises it, a replica with less demand than this PoP's pace
	// is guessed at it, and this PoP held back (docs/accuracy-log.md,
	// "paceHits and paceFloor").
	PaceHits  = 20.0
	paceFloor = int64(50 * time.Millisecond)
	// BeforeSlack is how much later than a flush and a delay a replica's
	// first news of a key may come (before): jitter and scheduling.
	BeforeSlack = float64(20 * time.Millisecond)
	// lagStep is a change of a replica's stamp-to-apply delay taken for a
	// step of a clock rather than jitter.
	lagStep = float64(50 * time.Millisecond)
	// StallReach is how far past a replica's usual gap the mirror (guess)
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
	StallReach = float64(200 * time.Millisecond)
	// steadyPace and SteadyCap bound the mirror where the room frees as
	// the window slides (see steady): there the mirror guesses high, and
	// the cap trades that against the worst window (docs/accuracy-log.md,
	// "steadyPace and steadyCap").
	steadyPace = 1.5
	SteadyCap  = 1.1
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

// NewClock returns the clock of the named replica, not heard from yet: held
// from Start on (see held). The name is kept, not copied.
func NewClock(name string) *Clock { return &Clock{name: name} }

// Name returns the name of the replica c is the clock of.
func (c *Clock) Name() string { return c.name }

// Sent returns the stamp, on the replica's clock, of the newest message of
// it applied here (unix ns); 0 before any.
func (c *Clock) Sent() int64 { return c.sent }

// Lookup returns the clock of the named replica among clocks, or nil.
// Clocks are few (one per other replica), so a slice beats a map.
func Lookup(clocks []*Clock, name string) *Clock {
	for _, c := range clocks {
		if c.name == name {
			return c
		}
	}
	return nil
}

// Start notes that the replica, if it has not been heard from, has been
// silent since now: the store's first check or apply (see held).
func (c *Clock) Start(now int64) {
	if c.recv == 0 {
		c.recv = now
	}
}

// Shift moves the times c remembers by d: the clock they are on (this
// PoP's) stepped. A time not set yet stays unset.
func (c *Clock) Shift(d int64) {
	if c.recv != 0 { // 0: not started (see Start)
		c.recv += d
	}
	if c.beacon != 0 {
		c.beacon += d
	}
}

// Heard records that a message the replica stamped at sent was applied at now.
func (c *Clock) Heard(now, sent int64) {
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
func (c *Clock) sentAt() float64 { return float64(c.recv) - c.lag }

// Age is how old, at now, what the replica last told us probably is (see
// age), without the stall reach.
func (c *Clock) Age(now int64) float64 { return c.age(now, 0) }

// age is how old, at now, what the replica last told us probably is: the
// stamp-to-apply delay plus the time since, but at most one usual gap and
// reach more than that delay — past the gap, the replica would have sent
// news if it had any and its link were not stalled (see StallReach). While
// no gap is known (one message so far) there is no silence to follow: the
// age is the delay.
func (c *Clock) age(now int64, reach float64) float64 {
	if c.gap == 0 {
		reach = 0
	}
	a := float64(now-c.recv) + c.lag
	return min(max(a, 0), c.gap+c.lag+reach)
}

// held reports whether the replica's news is held up at now: it has been
// silent for more than twice its usual gap between messages, but not for
// heldMax, and its presence beacons are overdue too; or, never heard from
// (a replica of the topology, MemoryConfig.Replicas), silent since the
// store's first check (Start) for not yet HeldFirst.
//
// Unheard guesses, for each replica that told of a key, what it admitted
// since its news (guess); a replica that told nothing of the key — in
// either window — counts nothing at all. Where it told nothing because its
// news is held up (a lost segment stalls its link for a retransmission,
// ≥ 200 ms; a cut), nothing is the least likely count: a key near its
// limit here is, as a rule, sprayed or spread, and a stalled replica
// probably admitted it as the replicas that told did. So Unheard counts
// each such replica at the mean of those: their sliding counts plus what
// it guessed of them. A replica whose news flows and that told nothing
// did not admit the key, and none is guessed for a key no other replica
// told of (one pinned to this PoP) (docs/accuracy-log.md, "held").
//
// A held replica that did tell of the key is no better known: its count
// stopped at what it told before the stall, and its guess stops growing a
// StallReach past its usual gap. So it too counts at least at the mean of
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
// StallReach covers it for the replicas that told of the key) and leaves
// it the cuts and the long stalls.
//
// A replica never heard from is held while its first news could still be
// on the way: a region stalled from the start of a key (a sprayer that
// begins as the PoPs start) tells nothing of its first hits, and the far
// regions' first news is 150 ms away at best. But only for HeldFirst: held
// for as long as a heard replica, a replica that never has traffic of its
// own stopped counting in the middle of a busy window and the PoPs all took
// the room it left at once (docs/accuracy-log.md, "held").
func (c *Clock) held(now int64) bool {
	silent := float64(now - c.recv)
	if c.sent == 0 {
		return silent > heldMin && silent < HeldFirst
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

// heldMin and heldMax bound the silence held takes for a stall; HeldFirst
// is heldMax for a replica never heard from: the longest one-way delay
// between continents, a flush and a retransmission.
const (
	heldMin   = float64(20 * time.Millisecond)
	heldMax   = float64(3 * time.Second)
	HeldFirst = float64(500 * time.Millisecond)
)

// before reports whether the replica's latest news, which told nothing of
// a key, was sent before the key's onset and its first news of the key may
// still be on the way: one flush (FirstNewsSpan) and its usual delay from
// the onset, and BeforeSlack. Such a replica counts as the ones that told
// of the key (Unheard), as one never heard from does (held). A sprayer
// arriving at PoPs that had been running (world-quiet) found the far
// replicas heard from a few ms before, silent of it and so counted as none,
// for the 150 ms their first news took: its first window settled at up to
// 120 of 100 (docs/accuracy-log.md, "before").
//
// The onset is when this PoP began to remember the key, unless the key was
// counted in the previous window (see Unheard): then it began no later than
// the current window did.
func (c *Clock) before(onset, now int64) bool {
	return c.sent != 0 && c.sentAt() < float64(onset) &&
		float64(now) < float64(onset)+c.lag+FirstNewsSpan+BeforeSlack
}

// Beaconed notes that a presence beacon of the replica was applied at now.
// Gaps under beaconFloor are not the replica's pace: two PoPs that meet
// answer each other's beacons at once, a few ms apart, and taking that for
// their pace held every quiet replica between two beacons.
func (c *Clock) Beaconed(now int64) {
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
