package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/edgelimit/edgelimit/region"
	"github.com/edgelimit/edgelimit/region/strong"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// natsconfServers runs `edgelimit natsconf` for topo and starts the two
// kinds of servers that use what it writes, each on a free loopback port: a
// nats-server (the library, as `nats-server -c` runs it) whose configuration
// includes the generated keys/edgelimit-accounts.conf as deploy/nats/*.conf
// do, and an embedded server of a PoP started with --nats-authorized-keys
// keys/authorized_keys. It returns the keys directory and the servers'
// client URLs by name.
func natsconfServers(t *testing.T, topo string) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	var out, errb bytes.Buffer
	if code := run([]string{"natsconf", "--topology", topo, "--keys", keys}, &out, &errb); code != 0 {
		t.Fatalf("natsconf: exit %d: %s", code, errb.String())
	}
	t.Setenv("NATS_SYS_PASSWORD", "sys5Secret2Ky")
	conf := filepath.Join(dir, "nats.conf")
	text := fmt.Sprintf("listen: 127.0.0.1:-1\njetstream { store_dir: %q, max_file_store: 64M }\ninclude keys/edgelimit-accounts.conf\n",
		filepath.Join(dir, "jetstream"))
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the generated accounts in a server configuration: %v", err)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(60 * time.Second) {
		t.Fatal("nats-server with the generated accounts did not start")
	}

	top, err := region.Parse(topo)
	if err != nil {
		t.Fatal(err)
	}
	users, err := replication.ReadAuthorizedKeys(filepath.Join(keys, "authorized_keys"), top)
	if err != nil {
		t.Fatal(err)
	}
	emb, err := replication.StartServer(replication.ServerConfig{Name: "embedded", Dir: t.TempDir(), Port: -1, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	return keys, map[string]string{"edgelimit-accounts.conf": srv.ClientURL(), "authorized_keys": emb.ClientURL()}
}

// subscribeRefused subscribes nc, whose asynchronous errors errs collects,
// to each subject, and waits until the server refuses each subscription. It
// returns the subscriptions, for the caller to show that nothing arrives on
// them.
func subscribeRefused(t *testing.T, nc *nats.Conn, errs *natstest.AsyncErrors, subjects ...string) []*nats.Subscription {
	t.Helper()
	var subs []*nats.Subscription
	for _, subject := range subjects {
		s, err := nc.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
		waitFor(t, "refused the subscription to "+subject, 60*time.Second, func() bool {
			return errs.Has(`Permissions Violation for Subscription to "` + subject + `"`)
		})
	}
	return subs
}

// popConn connects to url with pop's seed from keys, as a PoP does
// (replication.Connect); errs, when set, gets its asynchronous errors.
func popConn(t *testing.T, url, keys, pop string, errs *natstest.AsyncErrors) *nats.Conn {
	t.Helper()
	nc, err := replication.Connect(replication.ConnConfig{URL: url, Name: pop, NKeySeedFile: filepath.Join(keys, pop+".nk"),
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if errs != nil {
		nc.SetErrorHandler(errs.Handler)
	}
	// Wait for the CONNECT to be answered, so that what follows is judged
	// by the credential's permissions.
	if err := nc.FlushTimeout(60 * time.Second); err != nil {
		t.Fatalf("%s connecting to %s: %v", pop, url, err)
	}
	return nc
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestNatsconfStrongRequests: with the credentials `edgelimit natsconf`
// writes — on a nats-server that includes its accounts file, and on an
// embedded server given its authorized_keys — a strong limit's request
// from another PoP, of the home's region and of another region, reaches
// the home PoP's credential and its reply comes back (the home may answer
// on the asker's inbox); a third PoP's credential cannot subscribe to the
// home's strong subject (it cannot answer as that key's home), and the
// home answers no request whose reply subject is not an inbox (its right to
// reply would otherwise publish where the asker may not). Without strong
// subjects in the permissions every such request timed out, and a strong
// limit silently fell to its partition policy.
func TestNatsconfStrongRequests(t *testing.T) {
	const topo = "eu=eu-1,eu-2;us=us-1"
	top, err := region.Parse(topo)
	if err != nil {
		t.Fatal(err)
	}
	keys, urls := natsconfServers(t, topo)
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			answered := make(chan strong.Request, 8)
			refused := make(chan error, 8)
			home := popConn(t, url, keys, "eu-1", nil)
			sub, err := replication.ServeStrong(home, "eu", "eu-1", func() int64 { return time.Now().UnixNano() },
				func(_ context.Context, _ int64, req strong.Request) (strong.Reply, error) {
					answered <- req
					return strong.Reply{ID: req.ID, Key: req.Key, Allowed: true, Remaining: req.Spec.Limit - req.Hits, Reset: req.Spec.Window}, nil
				}, func(err error) { refused <- err })
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			if err := home.FlushTimeout(60 * time.Second); err != nil {
				t.Fatal(err)
			}

			for i, asker := range []string{"eu-2", "us-1"} {
				var errs natstest.AsyncErrors
				nc := popConn(t, url, keys, asker, &errs)
				req := strong.Request{ID: uint64(i + 1), Key: "k-" + asker, Spec: strong.Spec{Limit: 10, Window: int64(time.Minute)}, Hits: 1}
				rep, _, err := replication.NewStrongAsker(nc, top).Ask(context.Background(), 0, "eu-1", req, int64(60*time.Second))
				if err != nil {
					t.Fatalf("%s asking eu-1: %v (asynchronous errors %v)", asker, err, errs.All())
				}
				if !rep.Allowed || rep.Key != req.Key || rep.Remaining != 9 {
					t.Errorf("%s got %+v from eu-1, want the home's admission of %q with 9 left", asker, rep, req.Key)
				}
				if got := <-answered; got.ID != req.ID || got.Key != req.Key {
					t.Errorf("eu-1 decided %+v, %s asked %+v", got, asker, req)
				}
			}

			// A third PoP's credential may not take the home's subject, nor
			// every strong subject; what it asked for is never delivered.
			var errs natstest.AsyncErrors
			impostor := popConn(t, url, keys, "eu-2", &errs)
			stolen := subscribeRefused(t, impostor, &errs, replication.StrongSubject("eu", "eu-1"), "edgelimit._strong.>")
			asker := popConn(t, url, keys, "us-1", nil)
			req := strong.Request{ID: 7, Key: "k-after", Spec: strong.Spec{Limit: 10, Window: int64(time.Minute)}, Hits: 1}
			if _, _, err := replication.NewStrongAsker(asker, top).Ask(context.Background(), 0, "eu-1", req, int64(60*time.Second)); err != nil {
				t.Fatalf("us-1 asking eu-1 while eu-2 tries to listen: %v", err)
			}
			<-answered
			// The server writes a message to each subscriber before it
			// answers a later PING of that subscriber's connection.
			if err := impostor.FlushTimeout(60 * time.Second); err != nil {
				t.Fatal(err)
			}
			for _, s := range stolen {
				if n, _, _ := s.Pending(); n != 0 {
					t.Errorf("eu-2's subscription to %s got %d strong requests for eu-1", s.Subject, n)
				}
			}

			// A request whose reply subject is another PoP's delta subject
			// (eu-2 may not publish there) gets no answer.
			var spyErrs natstest.AsyncErrors
			spy := popConn(t, url, keys, "us-1", &spyErrs)
			deltas, err := spy.SubscribeSync(replication.DeltaSubject("us", "us-1"))
			if err != nil {
				t.Fatal(err)
			}
			if err := spy.FlushTimeout(60 * time.Second); err != nil {
				t.Fatal(err)
			}
			forger := popConn(t, url, keys, "eu-2", nil)
			bad := strong.Request{ID: 8, Key: "k-forged", Spec: strong.Spec{Limit: 10, Window: int64(time.Minute)}, Hits: 1}
			if err := forger.PublishRequest(replication.StrongSubject("eu", "eu-1"), replication.DeltaSubject("us", "us-1"), strong.AppendRequest(nil, &bad)); err != nil {
				t.Fatal(err)
			}
			if err := forger.FlushTimeout(60 * time.Second); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-refused:
				if !strings.Contains(err.Error(), "not an inbox") {
					t.Errorf("eu-1 refused the request with a delta subject to reply to: %v, want \"not an inbox\"", err)
				}
			case req := <-answered:
				t.Fatalf("eu-1 decided %+v, whose reply subject is us-1's delta subject", req)
			case <-time.After(60 * time.Second):
				t.Fatal("eu-1 neither answered nor refused the request with a delta subject to reply to")
			}
			// eu-1's refusal comes after anything it would have published:
			// flushing eu-1, then us-1, brings any such message to the spy.
			if err := home.FlushTimeout(60 * time.Second); err != nil {
				t.Fatal(err)
			}
			if err := spy.FlushTimeout(60 * time.Second); err != nil {
				t.Fatal(err)
			}
			if n, _, _ := deltas.Pending(); n != 0 {
				t.Errorf("%d messages on us-1's delta subject after eu-1 was asked to reply there", n)
			}
		})
	}
}

// TestNatsconfPoPCannotDeleteConsumers: a PoP's credential, on a nats-server
// with the generated accounts, may create the ephemeral consumer it reads
// its region's stream with, but not delete a consumer: the server answers
// a delete with a permissions violation and the consumer stays. (A PoP
// never needs the delete: the ordered consumer it reads with deletes its
// previous consumer after a reset only as a courtesy, ignoring the answer,
// and the server drops an ephemeral consumer after its inactive threshold.)
func TestNatsconfPoPCannotDeleteConsumers(t *testing.T) {
	const topo = "eu=eu-1,eu-2"
	keys, urls := natsconfServers(t, topo)
	url := urls["edgelimit-accounts.conf"]
	stream := replication.StreamName("eu")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	own := popConn(t, url, keys, "eu-1", nil)
	js, err := jetstream.New(own)
	if err != nil {
		t.Fatal(err)
	}
	// The PoP may create its region's stream when it is missing, and read
	// it with an ordered consumer, as a Replicator does.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"edgelimit.eu.>"}, MaxAge: time.Minute}); err != nil {
		t.Fatalf("eu-1 creating its region's missing stream: %v", err)
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("eu-1's ordered consumer: %v", err)
	}
	name := cons.CachedInfo().Name

	for _, pop := range []string{"eu-1", "eu-2"} {
		var errs natstest.AsyncErrors
		nc := popConn(t, url, keys, pop, &errs)
		pjs, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		err = pjs.DeleteConsumer(dctx, stream, name)
		dcancel()
		if err == nil {
			t.Fatalf("%s deleted consumer %s of %s", pop, name, stream)
		}
		subject := fmt.Sprintf(`Permissions Violation for Publish to "$JS.API.CONSUMER.DELETE.%s.%s"`, stream, name)
		waitFor(t, pop+"'s delete refused", 60*time.Second, func() bool { return errs.Has(subject) })
	}
	if _, err := js.Consumer(ctx, stream, name); err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatalf("consumer %s is gone after the refused deletes", name)
		}
		t.Fatal(err)
	}
}

// TestNatsconfInboxesArePerPoP: with the credentials `edgelimit natsconf`
// writes, on both kinds of servers, a PoP reads replies on its own inboxes
// (_INBOX.<its public nkey>, which replication.Connect sets) and on no
// other: a JetStream request of eu-2 is answered, while eu-2's
// subscriptions to every inbox and to eu-1's are refused, and none of the
// replies and stream messages eu-1 then gets on its inboxes — whose reply
// subjects name its consumer — reaches eu-2.
func TestNatsconfInboxesArePerPoP(t *testing.T) {
	keys, urls := natsconfServers(t, "eu=eu-1,eu-2")
	pubOf := func(pop string) string {
		b, err := os.ReadFile(filepath.Join(keys, pop+".nk"))
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.ParseDecoratedNKey(b)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			var errs natstest.AsyncErrors
			spy := popConn(t, url, keys, "eu-2", &errs)
			sjs, err := jetstream.New(spy)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sjs.AccountInfo(ctx); err != nil {
				t.Fatalf("eu-2's JetStream request, answered on its own inbox: %v (asynchronous errors %v)", err, errs.All())
			}
			stolen := subscribeRefused(t, spy, &errs, "_INBOX.>", replication.InboxPrefix(pubOf("eu-1"))+".>")

			// eu-1 reads its region's stream (as a Replicator does) and
			// gets a message on its inbox, with its consumer's name.
			own := popConn(t, url, keys, "eu-1", nil)
			js, err := jetstream.New(own)
			if err != nil {
				t.Fatal(err)
			}
			stream := replication.StreamName("eu")
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"edgelimit.eu.>"}, MaxAge: time.Minute}); err != nil {
				t.Fatalf("eu-1 creating its region's missing stream: %v", err)
			}
			if _, err := js.Publish(ctx, replication.DeltaSubject("eu", "eu-1"), []byte("x")); err != nil {
				t.Fatal(err)
			}
			cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			msg, err := cons.Next(jetstream.FetchMaxWait(60 * time.Second))
			if err != nil {
				t.Fatalf("eu-1 reading its stream: %v", err)
			}
			if !strings.Contains(msg.Reply(), cons.CachedInfo().Name) {
				t.Fatalf("the delivery's reply subject %q does not name eu-1's consumer %s", msg.Reply(), cons.CachedInfo().Name)
			}
			// The server writes a message to each subscriber before it
			// answers a later PING of that subscriber's connection.
			if err := spy.FlushTimeout(60 * time.Second); err != nil {
				t.Fatal(err)
			}
			for _, s := range stolen {
				if n, _, _ := s.Pending(); n != 0 {
					t.Errorf("eu-2's subscription to %s got %d of eu-1's messages", s.Subject, n)
				}
			}
		})
	}
}
