package lab

import (
	"math"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/simulate"
)

// TestShapeScenario: the simulator's copy of each shape is that shape on
// the scenario's network, on the shapes' limit, and nothing of the
// scenario's own traffic or cuts, starting once every PoP has had the
// others' snapshot (ShapeLead); the alternating client's rate is the lab's
// measured one.
func TestShapeScenario(t *testing.T) {
	sc := loadScenario(t, "partition.yaml")
	for _, c := range []struct {
		shape   string
		span    time.Duration
		sources []simulate.Source
	}{
		{ShapePaced, 7 * time.Second, []simulate.Source{{Name: "paced", Key: ShapeKey, Rate: 20, Spread: simulate.Spray, End: 7500 * time.Millisecond}}},
		{ShapeBurst, 200 * time.Millisecond, []simulate.Source{{Name: "burst", Key: ShapeKey, Rate: 3000, Spread: simulate.Spray, End: 100 * time.Millisecond}}},
		{ShapeAlternate, 50 * time.Millisecond, []simulate.Source{
			{Name: "alternate-a", Key: ShapeKey, Rate: 1000, Spread: simulate.Anycast, PoP: "us-east", End: 50 * time.Millisecond},
			{Name: "alternate-b", Key: ShapeKey, Rate: 1000, Spread: simulate.Anycast, PoP: "eu-west", End: 50 * time.Millisecond},
		}},
	} {
		s := ShapeScenario(sc, c.shape, "bounded", c.span)
		lead := ShapeLead(sc)
		for i := range c.sources {
			c.sources[i].Start, c.sources[i].End = lead, lead+c.sources[i].End
		}
		if s.Limit.RequestsPerUnit != ShapeLimit || s.Limit.Unit != "hour" || s.Limit.Consistency != "bounded" {
			t.Errorf("%s: limit %+v, want %d per hour, bounded", c.shape, s.Limit, ShapeLimit)
		}
		if len(s.Partitions) != 0 || s.Duration != lead+c.span+time.Second || len(s.Latency) != len(sc.Latency) {
			t.Errorf("%s: partitions %v, duration %v, %d links; want none, %v, the scenario's %d", c.shape, s.Partitions, s.Duration, len(s.Latency), lead+c.span+time.Second, len(sc.Latency))
		}
		if len(s.Sources) != len(c.sources) {
			t.Fatalf("%s: sources %+v, want %+v", c.shape, s.Sources, c.sources)
		}
		for i, w := range c.sources {
			g := s.Sources[i]
			if g.Name != w.Name || g.Key != w.Key || math.Abs(g.Rate-w.Rate) > 1e-9 || g.Spread != w.Spread || g.PoP != w.PoP || g.Start != w.Start || g.End != w.End {
				t.Errorf("%s: source %+v, want %+v", c.shape, g, w)
			}
		}
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", c.shape, err)
		}
	}
	if got, err := ParseShapes("burst,alternate"); err != nil || len(got) != 2 || got[0] != ShapeBurst {
		t.Errorf("ParseShapes(burst,alternate) = %v, %v", got, err)
	}
	if got, _ := ParseShapes("all"); len(got) != len(Shapes) {
		t.Errorf("ParseShapes(all) = %v", got)
	}
	if _, err := ParseShapes("bursts"); err == nil {
		t.Error("ParseShapes accepted an unknown shape")
	}
}
