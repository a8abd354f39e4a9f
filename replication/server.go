package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// ServerConfig configures an embedded NATS server with JetStream. The zero
// value is not usable: Name and Dir are required.
type ServerConfig struct {
	// Name is the server's name, unique in the deployment (a PoP name or
	// region name, say).
	Name string
	// Dir is the data directory; JetStream stores under Dir/jetstream.
	Dir string
	// Host is the host the client listener binds; "" means 127.0.0.1.
	// Beyond loopback the server needs Users: StartServer refuses to start
	// an open server there (ErrOpenServer).
	Host string
	// Users, when set, are the only clients the server lets in: each PoP
	// with its own nkey and its Permissions.
	//
	// Without Users the server opens no client port at all (nats-server's
	// DontListen): its clients connect in process (ConnConfig.InProcess),
	// so nothing else on the machine can reach it — an anonymous client
	// could otherwise publish any PoP's counts or bits.
	Users []PoPKey
	// Anonymous, without Users, opens the client port anyway, on loopback
	// only, to clients without credentials, which may then publish
	// anything: for layouts that need it and say so (a second server of one
	// PoP, the demo's servers, tests). It contradicts Users.
	Anonymous bool
	// Admin, with Users, is the public nkey of a user that may administer
	// the streams (AdminPermissions): the PoP that runs the server connects
	// with it, in memory only, to create and update its region's stream
	// (replication.Config.Admin).
	Admin string
	// Port is the client port, with Users or Anonymous; -1 picks a free
	// port, 0 means NATS's 4222.
	Port int
	// Domain is the JetStream domain. Regions linked by leaf nodes each need
	// their own (use the region name); "" is the default domain.
	Domain string
	// MaxPayload is the largest message the server accepts; 0 means NATS's
	// default of 1 MiB. The Replicator splits batches to fit it.
	MaxPayload int32
	// MaxMemory and MaxStore cap JetStream's memory and file storage, in
	// bytes; 0 lets the server choose.
	MaxMemory, MaxStore int64
	// Cluster, when set, makes this server part of a NATS cluster (several
	// servers of one region).
	Cluster *ClusterConfig
	// Gateway, when set, links this server's cluster to other clusters into
	// a super-cluster. See StartServer, "How regions are linked", before
	// using it.
	Gateway *GatewayConfig
	// Leaf, when set, accepts leaf connections from other regions and/or
	// connects to other regions as a leaf.
	Leaf *LeafConfig
	// Logger receives the server's log, debug lines at slog.LevelDebug; nil
	// discards it.
	Logger *slog.Logger
	// Guard, when set, watches the JetStream store for a full disk and gets
	// JetStream writing again once space returns (StoreGuard). The caller
	// runs its Run.
	Guard *StoreGuard
	// Links, when set, watches this server's leaf links to the hub
	// (LinkWatch).
	Links *LinkWatch
}

// ClusterConfig makes a server one node of a region's NATS cluster.
type ClusterConfig struct {
	Name   string   // cluster name, usually the region's
	Host   string   // route listener host; "" means 127.0.0.1
	Port   int      // route listener port; -1 picks a free port
	Routes []string // nats-route:// URLs of the cluster's other servers
}

// GatewayConfig links a cluster to other clusters by gateways.
type GatewayConfig struct {
	Name    string              // this cluster's gateway name, equal to its cluster name
	Host    string              // gateway listener host; "" means 127.0.0.1
	Port    int                 // gateway listener port; -1 picks a free port
	Remotes map[string][]string // other clusters' gateway names and URLs
}

// LeafConfig accepts and/or makes leaf-node connections between regions.
type LeafConfig struct {
	// Host and Port are the leaf listener; Port 0 means the server accepts
	// no leaf connections, -1 picks a free port. Host "" means 127.0.0.1;
	// beyond loopback the listener needs Users: a leaf connection is let
	// in only with a PoP's or the Admin's nkey (what it may then do is that
	// user's Permissions), so StartServer refuses an open one
	// (ErrOpenServer). On loopback without Users, any process of the
	// machine may link in as a leaf.
	Host string
	Port int
	// RemoteNKeySeedFile is the nkey seed file this server's leaf remotes
	// log in with at the hub: a credential the hub's Users list (edgelimit
	// natsconf writes one per PoP; a region's server uses its PoP's). ""
	// connects without credentials, which a hub with Users refuses.
	RemoteNKeySeedFile string
	// NoAdvertise keeps the server from telling leaves the addresses of its
	// leaf listeners, so a leaf only ever uses the URLs it was given: set it
	// when leaves reach this server through a proxy, load balancer or NAT.
	NoAdvertise bool
	// Remotes are the other regions this server connects to as a leaf; each
	// entry lists the nats-leaf:// URLs of one region's servers.
	Remotes [][]string
	// ReconnectInterval is how soon a cut leaf connection is retried; 0
	// means NATS's default of one second.
	ReconnectInterval time.Duration
}

// StartServer starts an embedded NATS server with JetStream as cfg says, and
// returns it once it accepts connections and JetStream is ready (WaitReady,
// ten seconds). The caller owns the server and must Shutdown it. It returns
// an error for an invalid cfg or a server that does not come up; it never
// exits the process.
//
// # How regions are linked
//
// Each region is its own NATS cluster (one server per region in tests) and
// its own JetStream domain, named after the region. Regions are linked by
// leaf-node connections: one region (the hub) accepts leaf connections and
// every other region's servers connect to it as leaves, so core subjects flow
// between all regions while each region keeps its own JetStream meta group.
// A region's stream, EDGELIMIT_<REGION>, lives in that region's domain and
// sources the other regions' streams across domains (StreamSource.Domain,
// which sets the External API prefix "$JS.<region>.API"); two leaf regions
// reach each other's API through the hub.
//
// Why not the super-cluster (a cluster per region, gateways between them, one
// JetStream domain, each stream placed in its region's cluster)? Two reasons:
// the first follows from how clustered JetStream works (creating a stream or
// a consumer goes through the meta leader), the second we hit when trying it.
//
//   - Every region then shares one JetStream meta group, whose leader needs a
//     quorum of all servers of all regions. Cut the regions apart and the side
//     without that quorum (with two regions: both sides) can create no stream
//     and no consumer, so an ordered consumer that must be recreated after any
//     hiccup, or a PoP that restarts, stops reading even its own region's
//     batches until the link heals. That breaks "a partition between regions
//     stops nothing inside a region". With a domain per region everything a
//     region needs is inside it; only sourcing and presence cross the link.
//   - A one-server-per-region super-cluster (what tests can afford) does not
//     start JetStream at all: nats-server 2.15 refuses with "JetStream cluster
//     requires configured routes or solicited leafnode for the system account".
//
// The cost: leaf links form a tree (a mesh would loop), so the hub region
// relays the traffic between the other regions and a hub outage partitions
// them. A deployment that prefers the super-cluster can still run one and set
// Config.Placement instead of Config.Domains; that mode is not tested here.
//
// Stream sourcing across a cut link recovers on its own but not on a
// schedule: measured on loopback, 0.03 to 1.4 s after a heal when the source
// consumer survived the cut, but when the server tried to re-create the
// source consumer during the cut, that request waits 30 s and then backs off
// (10 s, 20 s, ... up to 2 minutes). The Replicator does not wait for it:
// every PoP sends numbered presence beacons over core NATS and takes the other
// regions' snapshots straight off their subjects; a PoP that misses a beacon
// of another PoP publishes its own snapshot at once. Counts converge within
// about half a second of a heal (TestPartition), the streams catch up later,
// and joining their batches again changes nothing.
func StartServer(cfg ServerConfig) (*server.Server, error) {
	opts, err := serverOptions(cfg)
	if err != nil {
		return nil, err
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("replication: new NATS server %q: %w", cfg.Name, err)
	}
	if cfg.Logger != nil || cfg.Guard != nil || cfg.Links != nil {
		l := cfg.Logger
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		s.SetLoggerV2(slogAdapter{l.With("nats_server", cfg.Name), cfg.Guard, cfg.Links}, true, false, false)
	}
	if cfg.Links != nil {
		cfg.Links.attach(s)
	}
	if cfg.Guard != nil {
		cfg.Guard.attach(s, opts)
	}
	s.Start()
	if err := WaitReady(s, 10*time.Second); err != nil {
		s.Shutdown()
		return nil, fmt.Errorf("replication: NATS server %q: %w", cfg.Name, err)
	}
	return s, nil
}

func serverOptions(cfg ServerConfig) (*server.Options, error) {
	if cfg.Name == "" {
		return nil, errors.New("replication: server config names no server")
	}
	if cfg.Dir == "" {
		return nil, fmt.Errorf("replication: server %q has no data directory", cfg.Name)
	}
	opts := &server.Options{
		ServerName:         cfg.Name,
		Host:               orLoopback(cfg.Host),
		Port:               cfg.Port,
		JetStream:          true,
		JetStreamDomain:    cfg.Domain,
		JetStreamMaxMemory: cfg.MaxMemory,
		JetStreamMaxStore:  cfg.MaxStore,
		StoreDir:           filepath.Join(cfg.Dir, "jetstream"),
		MaxPayload:         cfg.MaxPayload,
		NoSigs:             true,
		NoLog:              cfg.Logger == nil,
	}
	switch {
	case len(cfg.Users) > 0 && cfg.Anonymous:
		return nil, fmt.Errorf("replication: server %q lets in only its Users: it cannot also let in anonymous clients", cfg.Name)
	case len(cfg.Users) > 0:
		users := cfg.Users
		if cfg.Admin != "" {
			users = append(slices.Clip(users), PoPKey{POP: AdminUser, PublicKey: cfg.Admin})
		}
		opts.Nkeys = nkeyUsers(users)
	case !isLoopback(opts.Host):
		return nil, fmt.Errorf("%w: server %q would listen on %s; list the PoPs' public nkeys (--nats-authorized-keys, written by edgelimit natsconf) or keep --nats-host on loopback",
			ErrOpenServer, cfg.Name, opts.Host)
	case !cfg.Anonymous:
		opts.DontListen = true // clients connect in process
	}
	if c := cfg.Cluster; c != nil {
		opts.Cluster.Name = c.Name
		opts.Cluster.Host = orLoopback(c.Host)
		opts.Cluster.Port = c.Port
		routes, err := parseURLs(c.Routes)
		if err != nil {
			return nil, fmt.Errorf("replication: server %q cluster routes: %w", cfg.Name, err)
		}
		opts.Routes = routes
	}
	if g := cfg.Gateway; g != nil {
		opts.Gateway.Name = g.Name
		opts.Gateway.Host = orLoopback(g.Host)
		opts.Gateway.Port = g.Port
		for name, urls := range g.Remotes {
			us, err := parseURLs(urls)
			if err != nil {
				return nil, fmt.Errorf("replication: server %q gateway %q: %w", cfg.Name, name, err)
			}
			opts.Gateway.Gateways = append(opts.Gateway.Gateways, &server.RemoteGatewayOpts{Name: name, URLs: us})
		}
	}
	if l := cfg.Leaf; l != nil {
		if l.Port != 0 {
			if len(cfg.Users) == 0 && !isLoopback(orLoopback(l.Host)) {
				return nil, fmt.Errorf("%w: server %q would accept leaf connections on %s; list the PoPs' public nkeys (--nats-authorized-keys) or keep --nats-leaf-host on loopback",
					ErrOpenServer, cfg.Name, l.Host)
			}
			opts.LeafNode.Host = orLoopback(l.Host)
			opts.LeafNode.Port = l.Port
			opts.LeafNode.NoAdvertise = l.NoAdvertise
		}
		opts.LeafNode.ReconnectInterval = l.ReconnectInterval
		for i, urls := range l.Remotes {
			us, err := parseURLs(urls)
			if err != nil {
				return nil, fmt.Errorf("replication: server %q leaf remote %d: %w", cfg.Name, i, err)
			}
			if len(us) == 0 {
				return nil, fmt.Errorf("replication: server %q leaf remote %d has no URL", cfg.Name, i)
			}
			remote := &server.RemoteLeafOpts{URLs: us}
			if l.RemoteNKeySeedFile != "" {
				if err := leafNKey(remote, l.RemoteNKeySeedFile); err != nil {
					return nil, fmt.Errorf("replication: server %q leaf remote %d: %w", cfg.Name, i, err)
				}
			}
			opts.LeafNode.Remotes = append(opts.LeafNode.Remotes, remote)
		}
	}
	return opts, nil
}

// leafNKey makes remote log in with the user nkey whose seed is in file; the
// seed never crosses the wire.
func leafNKey(remote *server.RemoteLeafOpts, file string) error {
	seed, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("leaf credential: %w", err)
	}
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		return fmt.Errorf("leaf credential %s: %w", file, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return fmt.Errorf("leaf credential %s: %w", file, err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return fmt.Errorf("leaf credential %s holds a seed of another kind than a user", file)
	}
	raw, err := kp.Seed()
	if err != nil {
		return fmt.Errorf("leaf credential %s: %w", file, err)
	}
	remote.Nkey = string(raw) // the server signs the hub's nonce with it at every connect
	return nil
}

func orLoopback(host string) string {
	if host == "" {
		return "127.0.0.1"
	}
	return host
}

func parseURLs(raw []string) ([]*url.URL, error) {
	out := make([]*url.URL, 0, len(raw))
	for _, r := range raw {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("parse URL %q: %w", r, err)
		}
		out = append(out, u)
	}
	return out, nil
}

// WaitReady waits until s accepts client connections and its JetStream is
// usable (in a cluster: a meta leader is known and s is current with it). It
// returns an error naming what was not ready when timeout passes.
func WaitReady(s *server.Server, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if !s.ReadyForConnections(timeout) {
		return fmt.Errorf("not accepting connections after %v", timeout)
	}
	for {
		if s.JetStreamEnabled() && (!s.JetStreamIsClustered() || s.JetStreamIsCurrent()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("JetStream not ready after %v (enabled=%t clustered=%t)",
				timeout, s.JetStreamEnabled(), s.JetStreamIsClustered())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// slogAdapter is a server.Logger that writes to a slog.Logger. With a
// guard, the guard sees every warning and error first (StoreGuard).
type slogAdapter struct {
	l     *slog.Logger
	guard *StoreGuard
	links *LinkWatch
}

func (a slogAdapter) Noticef(format string, v ...any) { a.l.Info(fmt.Sprintf(format, v...)) }
func (a slogAdapter) Warnf(format string, v ...any)   { a.problem(slog.LevelWarn, format, v) }
func (a slogAdapter) Fatalf(format string, v ...any)  { a.problem(slog.LevelError, format, v) }
func (a slogAdapter) Errorf(format string, v ...any)  { a.problem(slog.LevelError, format, v) }

func (a slogAdapter) problem(level slog.Level, format string, v []any) {
	msg := fmt.Sprintf(format, v...)
	if a.links != nil {
		a.links.serverLine(msg)
	}
	if a.guard != nil && a.guard.serverLine(msg) {
		level = slog.LevelDebug
	}
	a.l.Log(context.Background(), level, msg)
}
func (a slogAdapter) Debugf(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }
func (a slogAdapter) Tracef(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }
