package replication_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/edgelimit/edgelimit/crdt/crdttest"
	edgelimitpb "github.com/edgelimit/edgelimit/proto"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// credServer is an embedded server of region eu that lets in only the
// nkeys of eu-1 and eu-2, each with its PoP's Permissions, and an admin.
type credServer struct {
	srv   *server.Server
	seeds map[string]string // PoP -> seed file
	admin nkeys.KeyPair
}

func startCredServer(t *testing.T) *credServer {
	t.Helper()
	dir := t.TempDir()
	cs := &credServer{seeds: map[string]string{}}
	var keys []replication.PoPKey
	for _, p := range []string{"eu-1", "eu-2"} {
		file, pub := popSeed(t, dir, p)
		cs.seeds[p] = file
		keys = append(keys, replication.PoPKey{Region: "eu", POP: p, PublicKey: pub})
	}
	var err error
	if cs.admin, err = nkeys.CreateUser(); err != nil {
		t.Fatal(err)
	}
	adminPub, _ := cs.admin.PublicKey()
	cs.srv, err = replication.StartServer(replication.ServerConfig{Name: "eu", Dir: dir, Port: -1, Domain: "eu", Users: keys, Admin: adminPub})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cs.srv.Shutdown)
	return cs
}

// conn connects as pop (its seed), or as the admin for pop "".
func (cs *credServer) conn(t *testing.T, pop string, v *natstest.AsyncErrors) *nats.Conn {
	t.Helper()
	cfg := replication.ConnConfig{URL: cs.srv.ClientURL(), Name: pop, NKeySeedFile: cs.seeds[pop], Logger: testLogger(t)}
	if pop == "" {
		cfg.NKeySeedFile, cfg.NKey, cfg.Name = "", cs.admin, "admin"
	}
	nc, err := replication.Connect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if v != nil {
		nc.SetErrorHandler(v.Handler)
	}
	t.Cleanup(nc.Close)
	return nc
}

// startEU runs PoP pop of region eu on cs, through admin when not nil.
func (cs *credServer) startEU(t *testing.T, name string, admin *nats.Conn) *pop {
	t.Helper()
	counts := newMemCounts(name)
	rep, stop := runReplicator(t, replication.Config{Region: "eu", POP: name, Topology: topology(map[string][]string{"eu": {"eu-1", "eu-2"}}),
		Conn: cs.conn(t, name, nil), Admin: admin, Counts: counts, Bounds: probeBounds{}, Domains: map[string]string{"eu": "eu"}, Logger: testLogger(t)})
	return &pop{name: name, region: "eu", counts: counts, rep: rep, stop: stop}
}

// forgeryConfig is the probe's stream: eu-2's subject transformed into
// eu-1's.
func forgeryConfig(t *testing.T, js jetstream.JetStream) jetstream.StreamConfig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, replication.StreamName("eu"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = []string{"edgelimit.eu.delta.eu-2", "edgelimit.eu.delta.eu-1", "edgelimit.eu.snapshot.*", "edgelimit.eu.bits.*"}
	cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: "edgelimit.eu.delta.eu-2", Destination: "edgelimit.eu.delta.eu-1"}
	return cfg
}

func streamConfig(t *testing.T, js jetstream.JetStream) jetstream.StreamConfig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, replication.StreamName("eu"))
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().Config
}

// TestPoPCannotAdministerStream re-runs the probe of issue 27: with eu-2's
// credential, update region eu's stream so that eu-2's subject becomes
// eu-1's. The server refuses the request (a permissions violation; no
// stream update, purge or delete is granted to a PoP) and the stream stays
// as it was; eu-2 may still create a missing stream, which never changes an
// existing one.
func TestPoPCannotAdministerStream(t *testing.T) {
	cs := startCredServer(t)
	admin := cs.conn(t, "", nil)
	cs.startEU(t, "eu-1", admin)

	var v natstest.AsyncErrors
	nc := cs.conn(t, "eu-2", &v)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	before := streamConfig(t, js)
	forged := forgeryConfig(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err = js.UpdateStream(ctx, forged)
	cancel()
	if err == nil {
		t.Fatal("eu-2's credential updated the region's stream")
	}
	t.Logf("eu-2 updating EDGELIMIT_EU with a subject transform: %v", err)
	purgeErr := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, replication.StreamName("eu"))
		if err != nil {
			return err
		}
		return s.Purge(ctx)
	}()
	deleteErr := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return js.DeleteStream(ctx, replication.StreamName("eu"))
	}()
	if purgeErr == nil || deleteErr == nil {
		t.Fatalf("eu-2's credential: purge %v, delete %v; want both refused", purgeErr, deleteErr)
	}
	for _, subject := range []string{"$JS.API.STREAM.UPDATE.EDGELIMIT_EU", "$JS.API.STREAM.PURGE.EDGELIMIT_EU", "$JS.API.STREAM.DELETE.EDGELIMIT_EU"} {
		if _, err := waitFor(5*time.Second, func() error {
			if !v.Has("Permissions Violation for Publish to \"" + subject + "\"") {
				return errors.New("no permissions violation yet")
			}
			return nil
		}); err != nil {
			t.Errorf("%s as eu-2: %v (errors %v)", subject, err, v.All())
		}
	}
	after := streamConfig(t, js)
	if after.SubjectTransform != nil || !equalStrings(after.Subjects, before.Subjects) {
		t.Errorf("the stream changed: subjects %q transform %+v, before %q", after.Subjects, after.SubjectTransform, before.Subjects)
	}
	// Creating the existing stream with another configuration changes nothing either.
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	_, err = js.CreateStream(ctx, forged)
	cancel()
	if err == nil {
		t.Error("eu-2 created the existing stream anew with a subject transform")
	}
	if after := streamConfig(t, js); after.SubjectTransform != nil {
		t.Errorf("the stream has a transform after eu-2's create: %+v", after.SubjectTransform)
	}
}

// TestStreamVerified: a region stream changed behind the PoPs' back (an
// operator's mistake, a server configured by hand, or a credential from
// before PoPs lost stream administration) makes every PoP not ready, naming
// what differs (Replicator.StreamErr), and a batch that the change puts
// under eu-1's name is checked as eu-1 checks another PoP's: a count of 2^40
// is clamped to the bound and counted as count_bound. A PoP with an admin
// connection restores the stream by itself; then both are ready again.
func TestStreamVerified(t *testing.T) {
	cs := startCredServer(t)
	admin := cs.conn(t, "", nil)
	eu1, eu2 := cs.startEU(t, "eu-1", nil), cs.startEU(t, "eu-2", nil)
	for _, p := range []*pop{eu1, eu2} {
		if err := p.rep.StreamErr(); err != nil {
			t.Fatalf("%s before the change: %v", p.name, err)
		}
	}
	ajs, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ajs.UpdateStream(ctx, forgeryConfig(t, ajs)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*pop{eu1, eu2} {
		if _, err := waitFor(20*time.Second, func() error {
			err := p.rep.StreamErr()
			if err == nil || !errors.Is(err, replication.ErrStreamConfig) || !strings.Contains(err.Error(), "subject transform") {
				return fmt.Errorf("StreamErr %v", err)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s on a stream with a subject transform: %v", p.name, err)
		}
		t.Logf("%s: %v", p.name, p.rep.StreamErr())
	}

	// eu-2 publishes on its own subject; the stream stores it as eu-1's.
	forged := &edgelimitpb.DeltaBatch{Replica: "eu-1", Region: "eu", Seq: 1, SentUnixNano: time.Now().UnixNano()}
	forged.Add([]byte("k"), w0, 1<<40)
	publishRaw(t, cs.conn(t, "eu-2", nil), replication.DeltaSubject("eu", "eu-2"), marshal(t, forged))
	if _, err := waitFor(10*time.Second, func() error {
		if n := eu1.rep.Stats().Rejected[replication.RejectCount]; n == 0 {
			return errors.New("no count_bound reject at eu-1 yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := eu1.counts.State().Total("k", w0, nil); n > 400 {
		t.Errorf("eu-1 took %d as its own count from a batch under its name, want at most the bound 400", n)
	}

	// eu-1 with an admin connection restores the stream.
	eu1.stop()
	cs.startEU(t, "eu-1", admin)
	if _, err := waitFor(20*time.Second, func() error {
		if err := eu2.rep.StreamErr(); err != nil {
			return err
		}
		if c := streamConfig(t, ajs); c.SubjectTransform != nil {
			return fmt.Errorf("transform %+v", c.SubjectTransform)
		}
		return nil
	}); err != nil {
		t.Fatalf("the stream was not restored by the PoP with an admin connection: %v", err)
	}
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00")
}

// TestPoPReadsOnWithoutConsumerDelete: a PoP's credential may not delete a
// consumer (Permissions), and the PoP does not need to: when the consumer
// it reads the region's stream with disappears (deleted here by the
// operator's credential, as the server deletes one after its inactive
// threshold), the ordered consumer makes a new one — its delete of the old
// one is refused and ignored — and the PoP goes on applying the other PoP's
// batches from the stream past the point of the deletion.
func TestPoPReadsOnWithoutConsumerDelete(t *testing.T) {
	cs := startCredServer(t)
	admin := cs.conn(t, "", nil)
	eu1 := cs.startEU(t, "eu-1", admin)
	eu2 := cs.startEU(t, "eu-2", nil)
	for _, p := range []*pop{eu1, eu2} {
		select {
		case <-p.rep.Ready():
		case <-time.After(60 * time.Second):
			t.Fatalf("%s's consumer not started", p.name)
		}
	}
	ajs, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	stream := replication.StreamName("eu")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	s, err := ajs.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	var before []string
	for name := range s.ConsumerNames(ctx).Name() {
		before = append(before, name)
	}
	if len(before) != 2 {
		t.Fatalf("consumers of %s: %q, want eu-1's and eu-2's", stream, before)
	}
	for _, name := range before {
		if err := ajs.DeleteConsumer(ctx, stream, name); err != nil {
			t.Fatal(err)
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deletedAt := info.State.LastSeq

	var o crdttest.Oracle
	addRandom(newRand(t), []*pop{eu2}, 10, 50, &o)
	if _, err := waitFor(120*time.Second, func() error {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.LastSeq <= deletedAt {
			return errors.New("eu-2 has published nothing since the deletion")
		}
		if got := eu1.rep.Stats().LastAppliedSeq; got < info.State.LastSeq {
			return fmt.Errorf("eu-1 applied the stream up to %d of %d", got, info.State.LastSeq)
		}
		return converged(&o, eu1)
	}); err != nil {
		t.Fatalf("after its consumer was deleted: %v", err)
	}
	var after []string
	for name := range s.ConsumerNames(ctx).Name() {
		after = append(after, name)
	}
	for _, name := range after {
		for _, old := range before {
			if name == old {
				t.Errorf("consumer %s is back", name)
			}
		}
	}
	t.Logf("consumers before the deletion %q, after %q", before, after)
}
