package pop

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/region"
)

// TestScenarios runs the scripts in testdata/scenarios: PoPs of several
// regions with real engines, replicating stores and mitigation tables, whose
// counts and bits move only when a script says flush (deltas and new bits)
// or snapshot (full state), between PoPs whose link is not cut. Commands:
//
//	pops NAME@REGION ...            the deployment
//	limit KEY N/UNIT SCOPE [ban D]  one limit on descriptor KEY
//	at D                            the virtual time (from a minute boundary)
//	check POP KEY=VALUE xN -> M     N single checks, M of them admitted
//	flush | snapshot                move deltas and bits | full state
//	cut | heal                      cut the regions apart (each enforces its share) | restore
//	mitigated POP KEY=VALUE until D | not-mitigated POP KEY=VALUE
//	bits POP N                      POP has N bits waiting to be published
//	deltas POP N                    POP has N slots waiting to be published
func TestScenarios(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "scenarios", "*.txt"))
	if len(files) == 0 {
		t.Fatal("no scenarios")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

type scenarioPoP struct {
	name, region string
	eng          *Engine
	mem          *store.Memory
	mit          *Mitigations
	pendingBits  []crdt.Bit // taken from mit by a "bits" command, still to publish
}

type scenario struct {
	t    *testing.T
	top  region.Topology
	pops []*scenarioPoP
	by   map[string]*scenarioPoP
	set  *rules.Set
	now  time.Time
	cut  bool
}

func runScenario(t *testing.T, file string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := &scenario{t: t, by: map[string]*scenarioPoP{}, now: t0, top: region.Topology{Regions: map[string][]string{}}}
	lines := bufio.NewScanner(f)
	for n := 1; lines.Scan(); n++ {
		line := strings.TrimSpace(lines.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := sc.do(strings.Fields(line)); err != nil {
			t.Fatalf("%s:%d: %s: %v", filepath.Base(file), n, line, err)
		}
	}
}

func (sc *scenario) do(w []string) error {
	switch w[0] {
	case "pops":
		for _, p := range w[1:] {
			name, reg, ok := strings.Cut(p, "@")
			if !ok {
				return fmt.Errorf("want NAME@REGION, got %q", p)
			}
			sc.top.Regions[reg] = append(sc.top.Regions[reg], name)
			sc.pops = append(sc.pops, &scenarioPoP{name: name, region: reg})
		}
		return nil
	case "limit":
		return sc.limit(w[1:])
	case "at":
		d, err := time.ParseDuration(w[1])
		sc.now = t0.Add(d)
		return err
	case "check":
		return sc.check(w[1:])
	case "flush":
		for _, p := range sc.pops {
			bits := append(p.pendingBits, p.mit.BitsDelta()...)
			p.pendingBits = nil
			sc.deliver(p, p.mem.Delta(), bits)
		}
		return nil
	case "snapshot":
		for _, p := range sc.pops {
			sc.deliver(p, p.mem.Own(), p.mit.Active(sc.now.UnixNano()))
		}
		return nil
	case "cut", "heal":
		sc.cut = w[0] == "cut"
		for _, p := range sc.pops {
			share := 1.0
			if sc.cut {
				share = region.Share(1, len(sc.top.Regions), 0)
			}
			p.eng.SetGlobalShare(share)
		}
		return nil
	case "mitigated", "not-mitigated":
		p, key, err := sc.pop(w[1]), sc.key(w[2]), error(nil)
		until, ok := p.mit.Until(key, sc.now.UnixNano())
		if w[0] == "not-mitigated" {
			if ok {
				return fmt.Errorf("mitigated until %v", time.Duration(until-t0.UnixNano()))
			}
			return nil
		}
		want, err := time.ParseDuration(w[4])
		if err != nil {
			return err
		}
		if !ok || until != t0.Add(want).UnixNano() {
			return fmt.Errorf("mitigated %v until %v, want until %v", ok, time.Duration(until-t0.UnixNano()), want)
		}
		return nil
	case "bits":
		p := sc.pop(w[1])
		p.pendingBits = append(p.pendingBits, p.mit.BitsDelta()...)
		if want, _ := strconv.Atoi(w[2]); len(p.pendingBits) != want {
			return fmt.Errorf("%d bits waiting, want %d", len(p.pendingBits), want)
		}
		return nil
	case "deltas":
		if want, _ := strconv.Atoi(w[2]); len(sc.pop(w[1]).mem.Delta()) != want {
			return fmt.Errorf("slots waiting: want %d", want)
		}
		return nil
	}
	return fmt.Errorf("unknown command %q", w[0])
}

func (sc *scenario) limit(w []string) error {
	nu := strings.SplitN(w[1], "/", 2)
	n, err := strconv.ParseInt(nu[0], 10, 64)
	if err != nil || len(nu) != 2 {
		return fmt.Errorf("want N/UNIT, got %q", w[1])
	}
	unit, err := rules.ParseUnit(nu[1])
	if err != nil {
		return err
	}
	scope, err := rules.ParseScope(w[2])
	if err != nil {
		return err
	}
	l := &rules.Limit{Domain: "api", Path: w[0], Name: w[0], Unit: unit, Scope: scope,
		Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: n, Window: int64(unit.Duration())}}
	if len(w) == 5 && w[3] == "ban" {
		if l.Mitigation, err = time.ParseDuration(w[4]); err != nil {
			return err
		}
	}
	root := &rules.Node{}
	root.Child(w[0], "").Add(l)
	if sc.set, err = rules.NewSet(rules.NewDomain("api", "scenario", root)); err != nil {
		return err
	}
	for _, p := range sc.pops {
		p.mem = store.NewMemory(store.MemoryConfig{Replica: p.name, RegionPeers: sc.top.Peers(p.name)})
		p.mit = NewMitigations(p.name)
		p.eng = NewEngine(p.mem, sc.set, nil)
		p.eng.UseMitigations(p.mit)
		sc.by[p.name] = p
	}
	return nil
}

func (sc *scenario) check(w []string) error {
	p := sc.pop(w[0])
	k, v, _ := strings.Cut(w[1], "=")
	times, err := strconv.Atoi(strings.TrimPrefix(w[2], "x"))
	if err != nil || w[3] != "->" {
		return fmt.Errorf("want POP KEY=VALUE xN -> M")
	}
	want, err := strconv.Atoi(w[4])
	if err != nil {
		return err
	}
	r := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: k, Value: v}}}}}
	var res Result
	got := 0
	for range times {
		if err := p.eng.CheckAt(context.Background(), sc.now, r, &res); err != nil {
			return err
		}
		if res.Code == OK {
			got++
		}
	}
	if got != want {
		return fmt.Errorf("admitted %d, want %d", got, want)
	}
	return nil
}

// deliver hands slots and bits from p to every PoP it can reach: all of them,
// or its own region's while the regions are cut apart. Region bits stay in
// their region.
func (sc *scenario) deliver(p *scenarioPoP, slots []crdt.Slot, bits []crdt.Bit) {
	for _, q := range sc.pops {
		if q == p || (sc.cut && q.region != p.region) {
			continue
		}
		q.mem.Apply(0, slots)
		for _, b := range bits {
			if limit.Scope(b.Scope) == limit.ScopeGlobal || q.region == p.region {
				q.mit.ApplyBits([]crdt.Bit{b})
			}
		}
	}
}

func (sc *scenario) pop(name string) *scenarioPoP {
	p := sc.by[name]
	if p == nil {
		sc.t.Fatalf("no PoP %q", name)
	}
	return p
}

// key is the store key of KEY=VALUE under the scenario's one limit.
func (sc *scenario) key(kv string) []byte {
	k, v, _ := strings.Cut(kv, "=")
	entries := []rules.Entry{{Key: k, Value: v}}
	return sc.set.Domain("api").Match(entries)[0].AppendKey(nil, entries)
}
