// Package natstest starts real, embedded NATS servers with JetStream for
// tests of package replication: one server per region, on free loopback
// ports, each in its own temporary directory, the regions linked the way
// production links them (a JetStream domain per region, leaf-node links to a
// hub region; see replication.StartServer, "How regions are linked") — except
// that every link runs through a fault-injecting TCP Proxy that a test can
// cut, heal and delay.
//
// Everything a Cluster starts is stopped by the test's cleanup. Set
// NATSTEST_LOG=1 to see the servers' logs, debug lines included, on stderr.
// The package is for tests only.
package natstest

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/edgelimit/edgelimit/deploy/lab/faultnet"
	"github.com/edgelimit/edgelimit/replication"
)

// Proxy is the fault-injecting TCP relay on every link between regions:
// faultnet.Proxy.
type Proxy = faultnet.Proxy

// NewProxy is faultnet.NewProxy: a Proxy on a free loopback port to target.
func NewProxy(target string) (*Proxy, error) { return faultnet.NewProxy(target) }

// Cluster is a set of regions, one embedded NATS server each. The first
// region named is the hub: it accepts the leaf connections of every other
// region, each through its own Proxy. A Cluster is safe for concurrent use.
type Cluster struct {
	regions []string
	servers map[string]*server.Server
	links   map[string]*Proxy // region -> proxy on its link to the hub; none for the hub
}

// LeafReconnect is how soon a server retries a cut leaf link: short, so that
// a healed link is back within a tenth of a second.
const LeafReconnect = 100 * time.Millisecond

// StartRegions starts one server per region, named after the region, with
// JetStream domain = region, links every region after the first to the first
// through a Proxy, and waits until every link is up. It fails the test when
// anything does not start. Cleanup stops everything.
func StartRegions(t testing.TB, regions ...string) *Cluster {
	t.Helper()
	if len(regions) == 0 {
		t.Fatal("natstest: StartRegions needs at least one region")
	}
	c := &Cluster{
		regions: slices.Clone(regions),
		servers: make(map[string]*server.Server),
		links:   make(map[string]*Proxy),
	}
	t.Cleanup(c.close)

	hub := regions[0]
	leafPort := 0
	if len(regions) > 1 {
		leafPort = FreePort(t)
	}
	c.start(t, hub, &replication.LeafConfig{Port: leafPort, NoAdvertise: true})
	for _, r := range regions[1:] {
		p, err := NewProxy(fmt.Sprintf("127.0.0.1:%d", leafPort))
		if err != nil {
			t.Fatal(err)
		}
		c.links[r] = p
		c.start(t, r, &replication.LeafConfig{
			Remotes:           [][]string{{"nats-leaf://" + p.Addr()}},
			ReconnectInterval: LeafReconnect,
		})
	}
	if err := c.WaitLinked(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *Cluster) start(t testing.TB, region string, leaf *replication.LeafConfig) {
	t.Helper()
	s, err := replication.StartServer(replication.ServerConfig{
		Name:   region,
		Dir:    t.TempDir(),
		Port:   -1,
		Domain: region,
		Leaf:   leaf,
		Logger: dbgLogger(),
		// Tests connect from outside, and forge messages, on loopback.
		Anonymous: true,
	})
	if err != nil {
		t.Fatalf("natstest: start region %q: %v", region, err)
	}
	c.servers[region] = s
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (c *Cluster) close() {
	for _, p := range c.links {
		p.Close()
	}
	for _, s := range c.servers {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Regions returns the region names, the hub first.
func (c *Cluster) Regions() []string { return slices.Clone(c.regions) }

// URL returns the client URL of region's server.
func (c *Cluster) URL(region string) string {
	if s := c.servers[region]; s != nil {
		return s.ClientURL()
	}
	return ""
}

// Server returns region's server, or nil.
func (c *Cluster) Server(region string) *server.Server { return c.servers[region] }

// Domains returns the JetStream domain of every region (the region's name),
// for replication.Config.Domains.
func (c *Cluster) Domains() map[string]string {
	m := make(map[string]string, len(c.regions))
	for _, r := range c.regions {
		m[r] = r
	}
	return m
}

// Link returns the proxy on region's link to the hub, or nil for the hub.
func (c *Cluster) Link(region string) *Proxy { return c.links[region] }

// Cut cuts every link between regions.
func (c *Cluster) Cut() {
	for _, p := range c.links {
		p.Cut()
	}
}

// Heal lets every link between regions reconnect. It does not wait for them
// (see WaitLinked).
func (c *Cluster) Heal() {
	for _, p := range c.links {
		p.Heal()
	}
}

// Delay delays every link between regions by d (0 for none).
func (c *Cluster) Delay(d time.Duration) {
	for _, p := range c.links {
		p.Delay(d)
	}
}

// WaitLinked waits until every region's leaf link is up.
func (c *Cluster) WaitLinked(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		linked := c.servers[c.regions[0]].NumLeafNodes() == len(c.regions)-1
		for _, r := range c.regions[1:] {
			linked = linked && c.servers[r].NumLeafNodes() == 1
		}
		if linked {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("natstest: regions %v not linked after %v", c.regions, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ClientProxy returns a new Proxy in front of region's client port, closed
// by the test's cleanup, and its nats:// URL: connect through it to cut a
// client off its server.
func (c *Cluster) ClientProxy(t testing.TB, region string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(c.URL(region))
	if err != nil {
		t.Fatalf("natstest: region %q URL: %v", region, err)
	}
	p, err := NewProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, "nats://" + p.Addr()
}

// Connect returns a client connection to region's server, closed by the
// test's cleanup. It retries forever on disconnects, as a PoP does.
func (c *Cluster) Connect(t testing.TB, region string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.URL(region), nats.Name("natstest-"+region), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("natstest: connect to region %q: %v", region, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func dbgLogger() *slog.Logger {
	if os.Getenv("NATSTEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
