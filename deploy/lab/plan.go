package lab

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab/faultnet"
	"github.com/edgelimit/edgelimit/simulate"
)

// Prefix starts the name of every namespace, link and process directory a
// lab makes; teardown removes everything so named.
const Prefix = "elab"

// NATSPerRegion is the number of NATS servers of every region: a cluster of
// three, as deploy/nats's configs list three routes; the hub's three make it
// redundant (one stopped keeps the regions linked).
const NATSPerRegion = 3

// Plan is a scenario laid out as hosts, links and traffic: pure data, built
// by NewPlan from a scenario and read by Run.
type Plan struct {
	Scenario simulate.Scenario
	Layout   Layout
	Regions  []RegionPlan // the first is the NATS hub
	// Links are the relays between every leaf region's servers and the
	// hub's, one per (leaf region, hub server).
	Links []LinkPlan
	// Direct are the relays of the PoPs' direct paths when the scenario
	// has them (Scenario.Direct, `edgelimit pop --nats-direct`): one per
	// (PoP, server of another region), nil without.
	Direct []DirectPlan
	// Loads are the `edgelimit load` runs that make the scenario's traffic.
	Loads []LoadPlan
	// Topology is every PoP's --topology.
	Topology string
}

// RegionPlan is one region: its index (1-based, the third octet of its
// subnet), NATS hosts, PoP servers' hosts (the servers of a PoP one after
// the other) and the hosts of its PoPs' redis-servers.
type RegionPlan struct {
	Name  string
	Index int
	NATS  []Host
	PoPs  []Host
	Redis []Host
}

// Host is one network namespace with one address on its region's bridge.
type Host struct {
	Name string // the NATS server's, PoP server's or redis-server's name
	NS   string // namespace
	IP   string
	// PoP is the PoP a PoP server serves (its --pop): Name for a PoP's
	// first server, Name without its "-s<k>" suffix for the others.
	PoP string
	// Redis is a PoP server's store, host:port of its PoP's redis-server;
	// "" for the embedded store.
	Redis string
}

// Store layouts of Layout.Store.
const (
	StoreEmbedded = "embedded" // every PoP counts in its own embedded store
	StoreRedis    = "redis"    // every PoP in its own redis-server, as deploy/ ships it
	StoreMixed    = "mixed"    // every other PoP in Redis, from the first: Redis PoPs beside embedded ones
)

// redisPort is every lab redis-server's port, as deploy/ ships it.
const redisPort = 6379

// Layout is how the PoPs of a plan count: in which store, and on how many
// servers. The zero value is one server per PoP on the embedded store.
type Layout struct {
	Store string // StoreEmbedded ("" too), StoreRedis or StoreMixed
	// Servers is the number of servers of every Redis PoP, all under the
	// PoP's name, counting into its one Redis, all taking traffic (0: 1).
	// An embedded PoP has one server: two embedded stores under one name
	// would be two replicas publishing as one.
	Servers int
}

// String names the layout as the lab's flags do.
func (l Layout) String() string {
	st := l.Store
	if st == "" {
		st = StoreEmbedded
	}
	if l.Store == StoreEmbedded || l.Store == "" || l.Servers <= 1 {
		return st
	}
	return fmt.Sprintf("%s, %d servers per Redis PoP sharing its Redis", st, l.Servers)
}

// redisPoP says whether the PoP at index i (over every region, in order)
// counts in Redis.
func (l Layout) redisPoP(i int) bool {
	return l.Store == StoreRedis || (l.Store == StoreMixed && i%2 == 0)
}

// LinkPlan is a relay: listening on the leaf region's wan address, relaying
// to one hub server's leaf port, with the scenario's link between the two
// regions.
type LinkPlan struct {
	Region string // the leaf region
	Listen string // host:port on Region's wan address
	Target string // host:port of a hub server's leaf listener
	Link   faultnet.Link
}

// DirectPlan is a relay of one PoP's direct path: listening on its region's
// wan address, relaying to one server of another region at its client port,
// with the scenario's link between the two regions. Every PoP has relays of
// its own, so its direct connection to a region is a TCP stream of its own,
// beside the leaf link and the other PoPs', that loses and stalls on its own
// as the simulator's direct path does (simulate's directFree: one per PoP
// and region). One per server, not per region, so that the PoP's NATS client
// can move to another server of the region when one stops, as it would
// without the lab in between.
type DirectPlan struct {
	PoP    string // the PoP that dials it
	From   string // the PoP's region: Listen is on its wan address
	To     string // the region of the server Target is
	Listen string // host:port on From's wan address
	Target string // host:port of To's server's client listener
	Link   faultnet.Link
}

// LoadPlan is one `edgelimit load` run, inside a PoP's namespace against it.
type LoadPlan struct {
	PoP    Host
	Source string
	Rate   float64 // requests/s
	Start  time.Duration
	End    time.Duration
}

// Addressing: region i's bridge is 10.213.i.0/24 (gateway .1, hosts from
// .10), its wan link 10.214.i.0/30 and its mgmt link 10.215.i.0/30 (root .1,
// gateway .2).
func subnet(i int) string    { return fmt.Sprintf("10.213.%d.0/24", i) }
func gwIP(i int) string      { return fmt.Sprintf("10.213.%d.1", i) }
func hostIP(i, j int) string { return fmt.Sprintf("10.213.%d.%d", i, 10+j) }
func wanIP(i int, gw bool) string {
	if gw {
		return fmt.Sprintf("10.214.%d.2", i)
	}
	return fmt.Sprintf("10.214.%d.1", i)
}
func mgmtIP(i int, gw bool) string {
	if gw {
		return fmt.Sprintf("10.215.%d.2", i)
	}
	return fmt.Sprintf("10.215.%d.1", i)
}

// Ports every host uses, as the shipped files say.
const (
	natsClientPort = 4222
	natsLeafPort   = 7422
	popPort        = 8080
)

// The direct paths' relays listen on their PoP's region's wan address from
// directPortFirst up, below Linux's ephemeral ports (32768 on), so that no
// relay's outgoing connection takes a port one of them needs.
const (
	directPortFirst = 14222
	directPortLast  = 32767
)

// ErrUnsupported is wrapped by NewPlan for a scenario the lab cannot run.
var ErrUnsupported = errors.New("lab: unsupported scenario")

// NewPlan lays out sc on the PoPs of layout lay. The scenario must have one
// limit key (the lab's loads all send the same value), no clock skew,
// duplicates or generated mix, and no on/off sources; regions are at most
// 250 and hold at most 240 hosts each. A scenario whose limit has
// consistency bounded runs only on embedded PoPs, as the PoPs refuse it on
// Redis.
func NewPlan(sc simulate.Scenario, lay Layout) (Plan, error) {
	if err := sc.Validate(); err != nil {
		return Plan{}, err
	}
	switch lay.Store {
	case "", StoreEmbedded, StoreRedis, StoreMixed:
	default:
		return Plan{}, fmt.Errorf("lab: store layout %q: want %s, %s or %s", lay.Store, StoreEmbedded, StoreRedis, StoreMixed)
	}
	if lay.Servers < 0 || lay.Servers > 9 {
		return Plan{}, fmt.Errorf("lab: %d servers per PoP: want 1 to 9", lay.Servers)
	}
	if err := BoundedOn(lay, sc.Limit.Consistency); err != nil {
		return Plan{}, err
	}
	switch {
	case len(sc.ClockSkew) > 0:
		return Plan{}, fmt.Errorf("%w: clock_skew (every namespace shares the machine's clock)", ErrUnsupported)
	case sc.Duplicate > 0:
		return Plan{}, fmt.Errorf("%w: duplicate (TCP delivers once)", ErrUnsupported)
	case sc.Mix != nil:
		return Plan{}, fmt.Errorf("%w: mix (the lab drives one key)", ErrUnsupported)
	case len(sc.Regions) > 250:
		return Plan{}, fmt.Errorf("%w: %d regions, at most 250", ErrUnsupported, len(sc.Regions))
	}
	p := Plan{Scenario: sc, Layout: lay}
	var topo []string
	var pops []Host
	var popNames []string
	popIndex := 0
	for i, r := range sc.Regions {
		if len(r.PoPs)*(max(lay.Servers, 1)+1)+NATSPerRegion > 240 {
			return Plan{}, fmt.Errorf("%w: region %s has %d PoPs, too many hosts for one subnet", ErrUnsupported, r.Name, len(r.PoPs))
		}
		rp := RegionPlan{Name: r.Name, Index: i + 1}
		for k := range NATSPerRegion {
			name := fmt.Sprintf("nats-%s-%d", r.Name, k+1)
			rp.NATS = append(rp.NATS, Host{Name: name, NS: Prefix + "-" + name, IP: hostIP(rp.Index, k)})
		}
		j := NATSPerRegion
		for _, pop := range r.PoPs {
			servers, store := 1, ""
			if lay.redisPoP(popIndex) {
				servers = max(lay.Servers, 1)
				name := "redis-" + pop
				rh := Host{Name: name, NS: Prefix + "-" + name, IP: hostIP(rp.Index, j), PoP: pop}
				j++
				rp.Redis = append(rp.Redis, rh)
				store = fmt.Sprintf("%s:%d", rh.IP, redisPort)
			}
			popIndex++
			popNames = append(popNames, pop)
			for k := range servers {
				name := pop
				if k > 0 {
					name = fmt.Sprintf("%s-s%d", pop, k+1)
				}
				h := Host{Name: name, NS: Prefix + "-pop-" + name, IP: hostIP(rp.Index, j), PoP: pop, Redis: store}
				j++
				rp.PoPs = append(rp.PoPs, h)
				pops = append(pops, h)
			}
		}
		p.Regions = append(p.Regions, rp)
		topo = append(topo, r.Name+"="+strings.Join(r.PoPs, ","))
	}
	p.Topology = strings.Join(topo, ";")
	hub := p.Regions[0]
	var err error
	for _, r := range p.Regions[1:] {
		l, err := link(sc, r.Name, hub.Name)
		if err != nil {
			return Plan{}, err
		}
		for k, s := range hub.NATS {
			p.Links = append(p.Links, LinkPlan{
				Region: r.Name,
				Listen: fmt.Sprintf("%s:%d", wanIP(r.Index, false), natsLeafPort+k),
				Target: fmt.Sprintf("%s:%d", s.IP, natsLeafPort),
				Link:   l,
			})
		}
	}
	if sc.Direct {
		if p.Direct, err = directRelays(sc, p.Regions); err != nil {
			return Plan{}, err
		}
	}
	for i, s := range sc.Sources {
		if s.On > 0 || s.Off > 0 {
			return Plan{}, fmt.Errorf("%w: sources[%d] (%s) is on/off", ErrUnsupported, i, s.Name)
		}
		if s.Key != sc.Sources[0].Key {
			return Plan{}, fmt.Errorf("%w: sources[%d] (%s) has key %q, sources[0] %q: the lab drives one key", ErrUnsupported, i, s.Name, s.Key, sc.Sources[0].Key)
		}
		add := func(h Host, rate float64) {
			p.Loads = append(p.Loads, LoadPlan{PoP: h, Source: s.Name, Rate: rate, Start: s.Start, End: s.End})
		}
		switch s.Spread {
		case simulate.Spray, simulate.Random:
			// Round-robin and uniform spreads give every PoP the same
			// share; random's draws are Poisson-thinned, spray's even.
			for _, h := range pops {
				add(h, s.Rate/float64(len(pops)))
			}
		default: // anycast, over the PoP's servers
			name := s.PoP
			if name == "" {
				name = popNames[i%len(popNames)]
			}
			var servers []Host
			for _, h := range pops {
				if h.PoP == name {
					servers = append(servers, h)
				}
			}
			if len(servers) == 0 {
				return Plan{}, fmt.Errorf("sources[%d]: no PoP %q", i, s.PoP)
			}
			for _, h := range servers {
				add(h, s.Rate/float64(len(servers)))
			}
		}
	}
	return p, nil
}

// BoundedOn returns an error when a limit of consistency c cannot run on
// layout lay: consistency bounded is built only on the embedded store, and
// a PoP on Redis refuses it (docs/consistency.md, "Where it runs").
func BoundedOn(lay Layout, c string) error {
	if c == "bounded" && (lay.Store == StoreRedis || lay.Store == StoreMixed) {
		return fmt.Errorf("%w: consistency bounded on the %s layout: a PoP on Redis refuses a bounded limit (built only on the embedded store; docs/consistency.md); run it on -store embedded", ErrUnsupported, lay.Store)
	}
	return nil
}

// directRelays lays out the relays of every PoP's direct paths: for each
// PoP and each server of every other region, one on the PoP's region's wan
// address, ports numbered from directPortFirst per wan address.
func directRelays(sc simulate.Scenario, regions []RegionPlan) ([]DirectPlan, error) {
	var out []DirectPlan
	for _, from := range regions {
		port := directPortFirst
		for _, h := range from.PoPs {
			for _, to := range regions {
				if to.Name == from.Name {
					continue
				}
				l, err := link(sc, from.Name, to.Name)
				if err != nil {
					return nil, err
				}
				for _, s := range to.NATS {
					if port > directPortLast {
						return nil, fmt.Errorf("%w: direct: region %s needs more relays than ports %d–%d", ErrUnsupported, from.Name, directPortFirst, directPortLast)
					}
					out = append(out, DirectPlan{PoP: h.Name, From: from.Name, To: to.Name,
						Listen: fmt.Sprintf("%s:%d", wanIP(from.Index, false), port),
						Target: fmt.Sprintf("%s:%d", s.IP, natsClientPort),
						Link:   l})
					port++
				}
			}
		}
	}
	return out, nil
}

// DirectFlag returns PoP pop's --nats-direct: every other region with the
// relays that lead to its servers, "region=nats://relay,…;region=…" in the
// plan's order of regions; "" when the plan has no direct paths. The URLs
// are plain nats://, as those of the PoP's own region's servers:
// deploy/nats's client port has no TLS (only the leaf links between sites
// do), and a PoP's direct connections take --nats's credentials and TLS.
func (p Plan) DirectFlag(pop string) string {
	var parts []string
	for _, r := range p.Regions {
		var urls []string
		for _, d := range p.Direct {
			if d.PoP == pop && d.To == r.Name {
				urls = append(urls, "nats://"+d.Listen)
			}
		}
		if len(urls) > 0 {
			parts = append(parts, r.Name+"="+strings.Join(urls, ","))
		}
	}
	return strings.Join(parts, ";")
}

// link returns the scenario's link between regions a and b as a relay
// carries it.
func link(sc simulate.Scenario, a, b string) (faultnet.Link, error) {
	l, err := find(sc, a, b)
	if err != nil {
		return faultnet.Link{}, err
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return faultnet.Link{Delay: ms(l.Ms), Jitter: ms(l.JitterMs), Loss: lossOn(sc, l)}, nil
}

// lossOn is the loss on link l of sc: its own, else the scenario's.
func lossOn(sc simulate.Scenario, l simulate.Link) float64 {
	if l.Loss != nil {
		return *l.Loss
	}
	return sc.Loss
}

// Region returns the plan of the region named name.
func (p Plan) Region(name string) (RegionPlan, bool) {
	i := slices.IndexFunc(p.Regions, func(r RegionPlan) bool { return r.Name == name })
	if i < 0 {
		return RegionPlan{}, false
	}
	return p.Regions[i], true
}

// cutRegion returns the region whose wan link a partition takes down: the
// side that is not the hub (every path between leaf regions crosses the
// hub, so cutting a leaf region's link cuts it from every other region).
func (p Plan) cutRegion(part simulate.Partition) string { return cutSide(p.Regions[0].Name, part) }

// cutSide is cutRegion with hub the hub region's name.
func cutSide(hub string, part simulate.Partition) string {
	if part.From == hub {
		return part.To
	}
	return part.From
}

// Shrink returns sc with at most popsPerRegion PoPs per region and every
// time (run, partitions, sources) scaled so that the run lasts duration: a
// short lab run of a scenario, which the simulator then runs too.
// popsPerRegion 0 keeps every PoP; duration 0 keeps the length.
func Shrink(sc simulate.Scenario, popsPerRegion int, duration time.Duration) simulate.Scenario {
	out := sc
	out.Regions = nil
	for _, r := range sc.Regions {
		if popsPerRegion > 0 && len(r.PoPs) > popsPerRegion {
			r.PoPs = r.PoPs[:popsPerRegion]
		}
		out.Regions = append(out.Regions, simulate.Region{Name: r.Name, PoPs: slices.Clone(r.PoPs)})
	}
	if duration <= 0 || duration == sc.Duration {
		out.Sources = slices.Clone(sc.Sources)
		out.Partitions = slices.Clone(sc.Partitions)
		return out
	}
	f := float64(duration) / float64(sc.Duration)
	scale := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * f).Round(100 * time.Millisecond)
	}
	out.Duration = duration
	out.Partitions = nil
	for _, pt := range sc.Partitions {
		pt.Start, pt.End = scale(pt.Start), scale(pt.End)
		out.Partitions = append(out.Partitions, pt)
	}
	out.Sources = nil
	for _, s := range sc.Sources {
		s.Start, s.End = scale(s.Start), scale(s.End)
		out.Sources = append(out.Sources, s)
	}
	return out
}

// HubRouted returns sc as the lab's network carries it, for the simulator to
// run beside the lab. Regions reach each other only through the hub (the
// first region), as deploy/nats links them: between two leaf regions the
// one-way latency is both legs' (their jitter too), and a message crosses
// two lossy links, so it is lost with 1−(1−p)² where one link loses p; and a
// cut, which the lab makes by taking a leaf region's link to the hub down,
// cuts that region from every other. With two regions it changes nothing.
//
// What it leaves out: in the lab one stall on a leaf's link to the hub holds
// up its news to every region at once, where the simulator stalls each pair
// of regions on its own.
func HubRouted(sc simulate.Scenario) (simulate.Scenario, error) {
	if len(sc.Regions) <= 2 {
		return sc, nil
	}
	hub := sc.Regions[0].Name
	out := sc
	out.Latency = nil
	legs := map[string]simulate.Link{} // each leaf's link to the hub
	for _, r := range sc.Regions {
		l, err := find(sc, r.Name, hub)
		if err != nil {
			return simulate.Scenario{}, err
		}
		legs[r.Name] = l
	}
	for i, a := range sc.Regions {
		for _, b := range sc.Regions[i:] {
			l, err := find(sc, a.Name, b.Name)
			if err != nil {
				return simulate.Scenario{}, err
			}
			if a.Name != b.Name && a.Name != hub && b.Name != hub {
				la, lb := legs[a.Name], legs[b.Name]
				loss := 1 - (1-lossOn(sc, la))*(1-lossOn(sc, lb))
				l = simulate.Link{From: a.Name, To: b.Name, Ms: la.Ms + lb.Ms, JitterMs: la.JitterMs + lb.JitterMs, Loss: &loss}
			}
			out.Latency = append(out.Latency, l)
		}
	}
	out.Partitions = nil
	for _, pt := range sc.Partitions {
		cut := cutSide(hub, pt)
		for _, r := range sc.Regions {
			if r.Name != cut {
				out.Partitions = append(out.Partitions, simulate.Partition{From: cut, To: r.Name, Start: pt.Start, End: pt.End, OneWay: pt.OneWay})
			}
		}
	}
	return out, out.Validate()
}

// find returns the scenario's link between regions a and b; a region with
// itself has latency 0 unless the scenario gives one.
func find(sc simulate.Scenario, a, b string) (simulate.Link, error) {
	for _, l := range sc.Latency {
		if (l.From == a && l.To == b) || (l.From == b && l.To == a) {
			return l, nil
		}
	}
	if a == b {
		return simulate.Link{From: a, To: b}, nil
	}
	return simulate.Link{}, fmt.Errorf("latency: no entry between %s and %s", a, b)
}
