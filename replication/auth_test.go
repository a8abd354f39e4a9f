package replication_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/edgelimit/edgelimit/crdt/crdttest"
	edgelimitpb "github.com/edgelimit/edgelimit/proto"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// popSeed makes an nkey for pop, writes its seed to a file, and returns the
// file and the public key.
func popSeed(t testing.TB, dir, pop string) (string, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	file := filepath.Join(dir, pop+".nk")
	if err := os.WriteFile(file, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return file, pub
}

// TestPerPoPCredentials: an embedded server with one nkey per PoP lets the
// PoPs replicate as before — their Permissions cover everything a
// Replicator does — while a PoP's credential publishing another PoP's delta
// or a beacon of another region is refused by the server and nothing of it
// reaches the other PoPs; a client without a credential is not let in.
func TestPerPoPCredentials(t *testing.T) {
	dir := t.TempDir()
	topo := topology(map[string][]string{"eu": {"fra1", "par1", "ams1"}, "us": {"iad1"}})
	seeds := map[string]string{}
	var keys []replication.PoPKey
	for _, p := range []string{"fra1", "par1", "ams1"} {
		file, pub := popSeed(t, dir, p)
		seeds[p] = file
		keys = append(keys, replication.PoPKey{Region: "eu", POP: p, PublicKey: pub})
	}
	srv, err := replication.StartServer(replication.ServerConfig{Name: "eu", Dir: dir, Port: -1, Domain: "eu", Users: keys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	if nc, err := nats.Connect(srv.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("a client without a credential was let in")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a client without a credential: %v, want an authorization violation", err)
	}

	start := func(p string) *pop {
		nc, err := replication.Connect(replication.ConnConfig{URL: srv.ClientURL(), Name: p, NKeySeedFile: seeds[p], Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		counts := newMemCounts(p)
		rep, stop := runReplicator(t, replication.Config{Region: "eu", POP: p, Topology: topo, Conn: nc, Counts: counts,
			Domains: map[string]string{"eu": "eu"}, Logger: testLogger(t)})
		return &pop{name: p, region: "eu", counts: counts, rep: rep, stop: stop}
	}
	fra, par := start("fra1"), start("par1")
	var o crdttest.Oracle
	addRandom(newRand(t), []*pop{fra, par}, 10, 100, &o)
	converge(t, 5*time.Second, &o, fra, par)

	// ams1's credential forges par1's delta and a beacon of region us.
	var v natstest.AsyncErrors
	// ams1's inboxes, the only ones its credential may read (Permissions).
	forger, err := nats.Connect(srv.ClientURL(), nats.ErrorHandler(v.Handler), mustNkey(t, seeds["ams1"]),
		nats.CustomInboxPrefix(replication.InboxPrefix(keys[2].PublicKey)))
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	forged := &edgelimitpb.DeltaBatch{Replica: "par1", Region: "eu", Seq: 1, SentUnixNano: time.Now().UnixNano()}
	forged.Add([]byte("forged"), w0, 1<<40)
	for subject, data := range map[string][]byte{
		replication.DeltaSubject("eu", "par1"): marshal(t, forged),
		"edgelimit._hello.us.iad1":             {1},
		"edgelimit._hot.eu.par1":               marshal(t, forged), // the direct path's subject
	} {
		if err := forger.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
		if err := forger.Flush(); err != nil {
			t.Fatal(err)
		}
		if _, err := waitFor(2*time.Second, func() error {
			if !v.Has("Permissions Violation for Publish to \"" + subject + "\"") {
				return errors.New("no permissions violation yet")
			}
			return nil
		}); err != nil {
			t.Errorf("publishing on %s as ams1: %v (errors %v)", subject, err, v.All())
		}
	}
	// Its own hot subject it may publish on, and subscribe to others'.
	hotSub, err := forger.SubscribeSync("edgelimit._hot.*.*")
	if err != nil {
		t.Fatal(err)
	}
	if err := forger.Publish("edgelimit._hot.eu.ams1", marshal(t, forged)); err != nil {
		t.Fatal(err)
	}
	if _, err := hotSub.NextMsg(2 * time.Second); err != nil {
		t.Errorf("ams1 on its own hot subject: %v (errors %v)", err, v.All())
	}
	// Its own subject it may use, and fra1 gets that.
	own := &edgelimitpb.DeltaBatch{Replica: "ams1", Region: "eu", Seq: 1, SentUnixNano: time.Now().UnixNano()}
	own.Add([]byte("barrier"), w0, 3)
	publishRaw(t, forger, replication.DeltaSubject("eu", "ams1"), marshal(t, own))
	if _, err := waitFor(3*time.Second, func() error {
		if n := fra.counts.State().Total("barrier", w0, nil); n != 3 {
			return errors.New("ams1's own delta not applied yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := fra.counts.State().Total("forged", w0, nil); n != 0 {
		t.Errorf("fra1 applied the forged count: %d", n)
	}
}

func mustNkey(t testing.TB, seedFile string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestOpenServerRefused: an embedded server beyond loopback without
// credentials does not start.
func TestOpenServerRefused(t *testing.T) {
	_, err := replication.StartServer(replication.ServerConfig{Name: "x", Dir: t.TempDir(), Host: "0.0.0.0", Port: -1})
	if !errors.Is(err, replication.ErrOpenServer) {
		t.Fatalf("StartServer on 0.0.0.0 without users: %v, want ErrOpenServer", err)
	}
	t.Log(err)
}

// TestLeafKeyOnlyLinks: on an embedded hub with per-PoP keys, only the leaf
// key links a region, and it links nothing else: a PoP's own seed is
// refused as a leaf login, and the leaf key as a client.
func TestLeafKeyOnlyLinks(t *testing.T) {
	dir := t.TempDir()
	popFile, popPub := popSeed(t, dir, "fra1")
	leafFile, leafPub := popSeed(t, dir, "leaf")
	port := natstest.FreePort(t)
	hub, err := replication.StartServer(replication.ServerConfig{Name: "eu", Dir: filepath.Join(dir, "eu"), Port: -1, Domain: "eu",
		Users: []replication.PoPKey{{Region: "eu", POP: "fra1", PublicKey: popPub}, {POP: replication.LeafUser, PublicKey: leafPub}},
		Leaf:  &replication.LeafConfig{Port: port}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Shutdown)

	if nc, err := nats.Connect(hub.ClientURL(), mustNkey(t, leafFile)); err == nil {
		nc.Close()
		t.Fatal("the leaf key was let in as a client")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("the leaf key as a client: %v, want an authorization violation", err)
	}

	leaf := func(name, seed string) {
		s, err := replication.StartServer(replication.ServerConfig{Name: name, Dir: filepath.Join(dir, name), Port: -1, Domain: name,
			Leaf: &replication.LeafConfig{Remotes: [][]string{{fmt.Sprintf("nats-leaf://127.0.0.1:%d", port)}},
				RemoteNKeySeedFile: seed, ReconnectInterval: 50 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
	}
	// The PoP's seed first: it has had every chance to link by the time the
	// leaf key's server has.
	leaf("us", popFile)
	leaf("ap", leafFile)
	if _, err := waitFor(30*time.Second, func() error {
		if hub.NumLeafNodes() == 0 {
			return errors.New("the leaf key's region has not linked")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := hub.NumLeafNodes(); n != 1 {
		t.Fatalf("%d leaf links, want 1: a PoP's key linked a region as a leaf", n)
	}
}
