package core

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Clock agreement. Every PoP starts its windows, stamps its counts and ends
// its mitigation bits by its own clock. When clocks disagree, "the same"
// window holds hits from different instants at different PoPs: a PoP whose
// clock runs 300 ms ahead opens the next window 300 ms early and admits a
// new window's worth while the others still fill the old one. NTP keeps
// well-run servers within milliseconds, but an edge site whose time source
// fails drifts, and a global limit is only as good as the PoPs' agreement on
// where a window begins.
//
// So the PoPs agree on a clock among themselves. The presence beacons carry
// NTP's four timestamps: a beacon says when it was sent (t3) and, for every
// PoP whose beacon this one heard, when that beacon was sent (t1) and when it
// arrived here (t2); the PoP it names notes when this beacon arrived (t4).
// That gives it the offset of the sender's clock from its own,
// θ = ((t2−t1) + (t3−t4)) / 2, wrong by at most half the difference between
// the two directions' delays, and the round trip δ = (t4−t1) − (t3−t2). Per
// peer the sample with the smallest round trip among the last few is kept,
// as NTP's clock filter does, since queueing only ever adds delay.
//
// Each PoP then moves its clock to the MEDIAN of all clocks it hears, its
// own included. The estimates are made on raw clocks (the correction taken
// out), so there is no feedback loop: every PoP computes median(raw) − own
// raw, and all of them land on the same median clock. A median, not a mean,
// so one PoP with a wild clock (or a forged beacon) cannot drag the others;
// and the correction is bounded by MaxClockStep.

// clockSamples is how many of a peer's latest samples the filter keeps.
const clockSamples = 8

// clockDeadband is the least change of the estimate that moves the clock:
// smaller changes are noise, and every move shifts window boundaries.
const clockDeadband = int64(5 * time.Millisecond)

// clockStale is how long a peer's estimate counts without a new sample.
const clockStale = int64(time.Minute)

// Echo is, in a beacon, what its sender knows of one other PoP's last beacon:
// when that PoP sent it (by that PoP's raw clock) and when it arrived (by the
// sender's raw clock).
type Echo struct {
	POP        string
	Sent, Recv int64
}

type clockSample struct{ theta, delay int64 }

type peerClock struct {
	lastSent, lastRecv int64 // the peer's last beacon: its raw send time and our raw receive time
	samples            [clockSamples]clockSample
	n, next            int
	sampled            int64 // our raw time of the last sample
}

// clockSync keeps the offset estimates and the correction.
type clockSync struct {
	off bool
	// quorum is how many clocks, this PoP's included, a median needs: a
	// majority of the topology's PoPs, and at least three when there are
	// three. Before it has heard that many, a median of the few it heard
	// could move the clock one way and the majority then move it back; and
	// of two clocks, nothing says which is wrong.
	quorum int
	max    int64 // bound on the correction and on any sample's offset
	peers  map[string]*peerClock
	// offset is the correction in use: the PoP's clock is its raw clock plus
	// offset.
	offset int64
}

func newClockSync(cfg *Config) clockSync {
	n := 0
	for _, pops := range cfg.Topology.Regions {
		n += len(pops)
	}
	return clockSync{off: cfg.NoClockSync, quorum: max(n/2+1, min(n, 3)), max: int64(cfg.MaxClockStep), peers: make(map[string]*peerClock)}
}

func (s *clockSync) peer(pop string) *peerClock {
	p := s.peers[pop]
	if p == nil {
		p = &peerClock{}
		s.peers[pop] = p
	}
	return p
}

// echoes returns what a beacon sent at raw time now tells the PoPs whose
// beacons arrived within fresh: sorted by PoP, so that runs are repeatable.
func (s *clockSync) echoes(now, fresh int64) []Echo {
	if s.off {
		return nil
	}
	var e []Echo
	for pop, p := range s.peers {
		if p.lastRecv != 0 && now-p.lastRecv <= fresh {
			e = append(e, Echo{POP: pop, Sent: p.lastSent, Recv: p.lastRecv})
		}
	}
	slices.SortFunc(e, func(a, b Echo) int { return strings.Compare(a.POP, b.POP) })
	return e
}

// heard takes a beacon of pop sent at raw time t3 and received at raw time
// t4, with e its echo of this PoP's own last beacon, if any. It reports
// whether a new sample was kept. Samples that cannot be right (a negative
// round trip, an offset past the bound) are dropped: the timestamps come
// from the network.
func (s *clockSync) heard(pop string, t3, t4 int64, e *Echo) bool {
	if s.off || t3 == 0 {
		return false
	}
	p := s.peer(pop)
	p.lastSent, p.lastRecv = t3, t4
	if e == nil || e.Sent == 0 || e.Recv == 0 {
		return false
	}
	t1, t2 := e.Sent, e.Recv
	delay := (t4 - t1) - (t3 - t2)
	theta := ((t2 - t1) + (t3 - t4)) / 2
	if delay < 0 || t4 < t1 || t3 < t2 || theta > s.max || theta < -s.max || delay > 2*s.max {
		return false
	}
	p.samples[p.next] = clockSample{theta, delay}
	p.next = (p.next + 1) % clockSamples
	p.n = min(p.n+1, clockSamples)
	p.sampled = t4
	return true
}

// target returns the correction that puts this PoP on the median clock of
// the PoPs it has fresh samples of, at raw time now, and how unsure it is;
// ok is false without a quorum.
//
// A peer's estimate is unsure by half its round trip until the filter holds
// clockSamples samples: the sample with the smallest round trip is the
// one least delayed by queueing only among enough of them. A message lost
// on a link between regions holds what follows it for a retransmission
// (≥ 200 ms), and a beacon caught behind it in one direction puts the
// offset half that far off. Traced on edgelimit sim's anycast (two regions
// of two PoPs, 40 ms apart), seed 0: the first beacons from the US reached
// Europe 180 ms late, each region took the other's clock for 90 ms off,
// the median of four moved each by half that (+45 and −45 ms) for the
// first second, and a window rolled 90 ms apart in the two regions: 3.2%
// over the limit there. review does not move the clock by less than the
// median's unsureness.
func (s *clockSync) target(now int64) (t, unsure int64, ok bool) {
	type estimate struct{ theta, unsure int64 }
	offs := []estimate{{}} // this PoP's own clock
	for _, p := range s.peers {
		if p.n == 0 || now-p.sampled > clockStale {
			continue
		}
		best := p.samples[0]
		for _, x := range p.samples[1:p.n] {
			if x.delay < best.delay {
				best = x
			}
		}
		e := estimate{theta: best.theta}
		if p.n < clockSamples {
			e.unsure = best.delay / 2
		}
		offs = append(offs, e)
	}
	if len(offs) < s.quorum {
		return 0, 0, false
	}
	slices.SortFunc(offs, func(a, b estimate) int { return cmp.Compare(a.theta, b.theta) })
	m := len(offs) / 2
	t, unsure = offs[m].theta, offs[m].unsure
	if len(offs)%2 == 0 {
		t = offs[m-1].theta + (offs[m].theta-offs[m-1].theta)/2
		unsure = (offs[m-1].unsure + offs[m].unsure) / 2
	}
	return max(-s.max, min(s.max, t)), unsure, true
}

// review moves the correction to the target when it changed by more than
// The unsureness is a peer's only while its filter fills (target): unsure
// for as long as the filter runs (half the round trip always), a skew
// smaller than half the round trip between continents (100–150 ms) would
// never be taken out (docs/accuracy-log.md, "clockSync.review").
func (s *clockSync) review(now int64) bool {
	if s.off {
		return false
	}
	t, unsure, ok := s.target(now)
	if !ok {
		return false
	}
	band := max(clockDeadband, unsure)
	if d := t - s.offset; d < band && d > -band {
		return false
	}
	s.offset = t
	return true
}
