package core

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/region"
)

// clockLab runs cores whose raw clocks are skewed from true time, and
// carries their beacons to each other with a one-way delay (plus a
// deterministic jitter), so that a test can watch them agree on a clock.
type clockLab struct {
	cores  []*Core
	skew   []int64 // raw clock − true time
	offset []int64 // the corrections their Readies gave
	delay  func(from, to int) int64
	queue  []flight
	now    int64  // true time
	moves  []move // every correction, as it came
}

type move struct {
	at     int64 // true time
	pop    int
	offset int64
}

type flight struct {
	at int64
	to int
	m  Message
}

func newClockLab(t *testing.T, skews []time.Duration, tune func(*Config)) *clockLab {
	t.Helper()
	names := []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"}[:len(skews)]
	topo := region.Topology{Regions: map[string][]string{"eu": names}}
	lab := &clockLab{skew: make([]int64, len(skews)), offset: make([]int64, len(skews)), now: t0}
	lab.delay = func(from, to int) int64 {
		return int64(20*time.Millisecond) + int64((from*7+to*3)%5)*int64(time.Millisecond)
	}
	for i, s := range skews {
		lab.skew[i] = int64(s)
		cfg := Config{Region: "eu", POP: names[i], Topology: topo, Counts: newCounts(), HelloInterval: 100 * time.Millisecond, SnapshotInterval: time.Hour}
		if tune != nil {
			tune(&cfg)
		}
		c, err := New(cfg, lab.clock(i))
		if err != nil {
			t.Fatal(err)
		}
		lab.cores = append(lab.cores, c)
	}
	return lab
}

func (l *clockLab) clock(i int) int64 { return l.now + l.skew[i] + l.offset[i] }

// run advances true time by d in steps of a millisecond.
func (l *clockLab) run(d time.Duration) {
	for end := l.now + int64(d); l.now < end; l.now += int64(time.Millisecond) {
		kept := l.queue[:0]
		var due []flight
		for _, f := range l.queue {
			if f.at <= l.now {
				due = append(due, f)
			} else {
				kept = append(kept, f)
			}
		}
		l.queue = kept
		for _, f := range due {
			l.cores[f.to].Step(l.clock(f.to), f.m)
			l.drain(f.to)
		}
		for i, c := range l.cores {
			if c.NextDeadline() <= l.clock(i) {
				c.Tick(l.clock(i))
				l.drain(i)
			}
		}
	}
}

func (l *clockLab) drain(i int) {
	c := l.cores[i]
	for c.HasReady() {
		rd := c.Ready()
		for _, m := range rd.Messages {
			if m.Kind != Hello {
				continue
			}
			for j := range l.cores {
				if j != i {
					l.queue = append(l.queue, flight{at: l.now + l.delay(i, j), to: j, m: m})
				}
			}
		}
		if rd.ClockChanged {
			l.offset[i] = rd.ClockOffset
			l.moves = append(l.moves, move{l.now, i, rd.ClockOffset})
		}
		c.Advance(rd)
	}
}

// TestClockAgreement: five PoPs, two of them 300 ms off either way and one
// 5 s off — past MaxClockStep. The first four settle on their median clock
// within a few milliseconds; the wild one is ignored by the others, and
// cannot itself move that far, so it stays where it is.
func TestClockAgreement(t *testing.T) {
	ms := time.Millisecond
	lab := newClockLab(t, []time.Duration{0, 0, 300 * ms, -300 * ms, 5 * time.Second}, nil)
	lab.run(2 * time.Second)
	for i, want := range []int64{0, 0, -300, 300} {
		got := lab.offset[i]
		if d := got - want*int64(ms); d > int64(2*ms) || d < -int64(2*ms) {
			t.Errorf("PoP %d: correction %v, want %v ± 2ms", i, time.Duration(got), time.Duration(want)*ms)
		}
	}
	if lab.offset[4] != 0 {
		t.Errorf("the PoP 5 s off moved by %v, past MaxClockStep", time.Duration(lab.offset[4]))
	}
	// The corrected clocks of the four agree: one window boundary for all.
	for i := 1; i < 4; i++ {
		if d := lab.clock(i) - lab.clock(0); d > int64(2*ms) || d < -int64(2*ms) {
			t.Errorf("PoP %d's clock is %v from PoP 0's", i, time.Duration(d))
		}
	}
}

// TestClockUnsureStart: four PoPs whose clocks agree, two on each side of a
// link whose first beacons one way are held 180 ms behind a lost message.
// Each side takes the other's clock for 90 ms off, and the median of four
// would move every clock by half that, a window boundary 90 ms apart on the
// two sides. While a peer's filter holds fewer than clockSamples samples
// its estimate is unsure by half its round trip, which the move is not
// past: no clock moves. A clock 300 ms off still moves at once.
func TestClockUnsureStart(t *testing.T) {
	ms := int64(time.Millisecond)
	lab := newClockLab(t, []time.Duration{0, 0, 0, 0}, nil)
	lab.delay = func(from, to int) int64 {
		d := 20*ms + int64((from*7+to*3)%5)*ms
		if from < 2 && to >= 2 && lab.now < t0+150*ms {
			d += 180 * ms // held behind a retransmission
		}
		return d
	}
	lab.run(2 * time.Second)
	for _, m := range lab.moves {
		t.Errorf("PoP %d moved its clock to %v at +%v", m.pop, time.Duration(m.offset), time.Duration(m.at-t0))
	}

	lab = newClockLab(t, []time.Duration{0, 0, 0, 300 * time.Millisecond}, nil)
	lab.run(200 * time.Millisecond)
	if got := lab.offset[3]; got > -298*ms || got < -302*ms {
		t.Errorf("the PoP 300 ms ahead: correction %v after 200 ms, want −300ms", time.Duration(got))
	}
}

// TestClockQuorum: a PoP that has heard only one other of a four-PoP
// topology keeps its clock: of two clocks, nothing says which is wrong.
func TestClockQuorum(t *testing.T) {
	lab := newClockLab(t, []time.Duration{0, 200 * time.Millisecond, 0, 0}, nil)
	lab.cores = lab.cores[:2] // the other two never start
	lab.skew, lab.offset = lab.skew[:2], lab.offset[:2]
	lab.run(2 * time.Second)
	if lab.offset[0] != 0 || lab.offset[1] != 0 {
		t.Fatalf("corrections %v without a quorum", lab.offset)
	}
}

// TestClockSyncOff: with NoClockSync the beacons carry no echoes and the
// clock never moves.
func TestClockSyncOff(t *testing.T) {
	lab := newClockLab(t, []time.Duration{0, 0, 300 * time.Millisecond}, func(c *Config) { c.NoClockSync = true })
	lab.run(time.Second)
	for _, f := range lab.queue {
		if len(f.m.Echo) > 0 {
			t.Fatalf("a beacon carries echoes with NoClockSync: %+v", f.m)
		}
	}
	if lab.offset[2] != 0 {
		t.Fatalf("the clock moved by %v with NoClockSync", time.Duration(lab.offset[2]))
	}
}

func TestBeaconRoundTrip(t *testing.T) {
	for _, m := range []Message{
		{Kind: Hello, Seq: 7},
		{Kind: Hello, Seq: 1 << 62, Sent: t0},
		{Kind: Hello, Seq: 3, Sent: t0, Echo: []Echo{{POP: "fra1", Sent: t0 - 312_000_000, Recv: t0 - 1_000}, {POP: "", Sent: t0 + 7_000, Recv: t0}}},
	} {
		seq, sent, echo, ok, err := ParseBeacon(AppendBeacon(nil, m))
		if !ok || err != nil || seq != m.Seq || sent != m.Sent || !reflect.DeepEqual(echo, m.Echo) && len(echo)+len(m.Echo) > 0 {
			t.Errorf("%+v came back as seq %d sent %d echo %+v ok %v err %v", m, seq, sent, echo, ok, err)
		}
	}
}

// TestBeaconMalformed: a beacon of the old format (a number only) parses; a
// beacon whose clock part is cut or padded keeps its number but loses its
// timestamps; one without even a number is refused.
func TestBeaconMalformed(t *testing.T) {
	good := AppendBeacon(nil, Message{Seq: 9, Sent: t0, Echo: []Echo{{POP: "fra1", Sent: t0, Recv: t0}}})
	for name, data := range map[string][]byte{
		"cut":    good[:len(good)-3],
		"padded": append(append([]byte{}, good...), 0),
		"huge count": func() []byte {
			b := AppendBeacon(nil, Message{Seq: 9, Sent: t0})
			return append(b[:len(b)-1], 0xff, 0xff, 0xff, 0x7f)
		}(),
	} {
		seq, sent, echo, ok, err := ParseBeacon(data)
		if !ok || seq != 9 || sent != 0 || echo != nil || !errors.Is(err, ErrBeacon) {
			t.Errorf("%s: seq %d sent %d echo %v ok %v err %v", name, seq, sent, echo, ok, err)
		}
	}
	if _, _, _, ok, _ := ParseBeacon(nil); ok {
		t.Error("an empty beacon parsed")
	}
}

// FuzzParseBeacon: any bytes parse without a panic, and what parses
// completely comes back the same through AppendBeacon.
func FuzzParseBeacon(f *testing.F) {
	f.Add(AppendBeacon(nil, Message{Seq: 1}))
	f.Add(AppendBeacon(nil, Message{Seq: 9, Sent: t0, Echo: []Echo{{POP: "fra1", Sent: t0, Recv: t0 + 5}}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		seq, sent, echo, ok, err := ParseBeacon(data)
		if !ok || err != nil {
			return
		}
		seq2, sent2, echo2, ok2, err2 := ParseBeacon(AppendBeacon(nil, Message{Seq: seq, Sent: sent, Echo: echo}))
		if !ok2 || err2 != nil || seq2 != seq || sent2 != sent || len(echo2) != len(echo) {
			t.Fatalf("re-encoded beacon differs: %d %d %v → %d %d %v (%v %v)", seq, sent, echo, seq2, sent2, echo2, ok2, err2)
		}
		for i := range echo {
			if echo[i] != echo2[i] {
				t.Fatalf("echo %d: %+v → %+v", i, echo[i], echo2[i])
			}
		}
	})
}
