package replication

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Every PoP connects to NATS with its own credential, an nkey, whose subject
// permissions let it publish only its own subjects (its deltas, snapshots,
// bits and presence beacons) and the JetStream API requests of its region's
// stream, and subscribe only to what a Replicator reads. A PoP's stolen or
// misused credential so cannot speak for another PoP; what it can still send
// on its own subjects, the receiver bounds (core.Bounds).
//
// Why nkeys rather than a user and password per PoP: the server's
// configuration then holds only public keys, so the generated permission
// blocks (edgelimit natsconf) can be reviewed, committed and shipped to every
// NATS server without holding a secret, and the seed never leaves the PoP
// (nats.go signs the server's nonce with it; no secret crosses the wire).
// Decentralised JWT auth (operator, accounts, creds files) would do the same
// with more moving parts; --nats-creds still works for it.

// Permissions returns the subjects the credential of PoP pop of region may
// publish to and subscribe to. It is the one definition of a PoP's NATS
// permissions: the embedded server (ServerConfig.Users) and the generated
// nats-server configuration (edgelimit natsconf) both use it.
//
// A PoP administers nothing: it may create its region's stream when it is
// missing ($JS.API.STREAM.CREATE, which never changes an existing stream)
// and read its configuration, and create the ephemeral consumers it reads
// with, but not update, purge or delete a stream, nor delete a consumer.
// (The ordered consumer a PoP reads with deletes its previous consumer after
// a reset only as a courtesy, ignoring the answer; the server drops that
// in-memory consumer after its inactive threshold, five minutes. A PoP that
// could delete consumers could delete the other PoPs' too: their names go
// by on the inboxes every PoP may read.) Changing a stream is an
// operator's credential's job (AdminPermissions), or the embedded server's
// own in-process connection's (ServerConfig.Admin): a PoP's credential could
// otherwise transform another PoP's subject into its own, or switch its
// region's replication off. Every PoP also checks its stream's configuration
// and does not consume one it does not expect (Replicator.StreamErr).
//
// Strong limits (StrongSubject) need three things of it: to publish requests
// to every PoP's strong subject, to subscribe to its own only (so no PoP can
// answer as another key's home), and to reply to the requests it gets on the
// asker's inbox. The last is not a subject here but nats-server's
// allow_responses (one reply per request received, within two minutes),
// which every PoP's user has besides these lists: granting "_INBOX.>" to
// publish instead would let any PoP write into the other PoPs' inboxes,
// where their JetStream replies and stream messages arrive. A strong request
// is the only one a PoP answers, and ServeStrong answers only on an inbox,
// so a request whose reply subject names another PoP's subject or the
// JetStream API gets no answer.
//
// Replies come to the PoP's own inboxes only, _INBOX.<its public nkey>.…
// (InboxPrefix; Connect sets it for a connection with an nkey): on a shared
// "_INBOX.>" every PoP would read the others' JetStream replies and stream
// deliveries, whose reply subjects name their consumers, and could then
// reconfigure another PoP's consumer ($JS.API.CONSUMER.CREATE with its name
// and another filter) to hide part of the stream from it.
func Permissions(k PoPKey) (publish, subscribe []string) {
	region, pop := k.Region, k.POP
	stream := StreamName(region)
	publish = []string{
		DeltaSubject(region, pop),
		SnapshotSubject(region, pop),
		BitsSubject(region, pop),
		helloSubject(region, pop),
		hotSubject(region, pop),
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.STREAM.CREATE." + stream,
		"$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.INFO." + stream + ".>",
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".>",
		// Strong limits: ask any PoP that is a key's home (StrongAsker).
		subjectRoot + "." + strongToken + ".*.*",
	}
	subscribe = []string{
		subjectRoot + "." + helloToken + ".*.*",
		subjectRoot + "." + hotToken + ".*.*",
		subjectRoot + ".*." + kindDelta + ".*",
		subjectRoot + ".*." + kindSnapshot + ".*",
		subjectRoot + ".*." + kindBits + ".*",
		// Strong limits: the requests of which this PoP is the home, its own
		// subject only, so no PoP can answer for another (ServeStrong).
		StrongSubject(region, pop),
		InboxPrefix(k.PublicKey) + ".>",
	}
	return publish, subscribe
}

// InboxPrefix returns the prefix of the inboxes of a connection that logs
// in with the nkey whose public key is publicKey: "_INBOX." and the key. A
// PoP's credential may subscribe to its own inboxes only (Permissions).
func InboxPrefix(publicKey string) string { return nats.InboxPrefix + publicKey }

// AdminPermissions returns the subjects an operator credential (edgelimit
// natsconf's admin.nk) may publish to: the JetStream API, to create and
// update every region's stream, and the replies it reads. It publishes no
// PoP's subjects.
func AdminPermissions() (publish, subscribe []string) {
	return []string{"$JS.API.>"}, []string{"_INBOX.>"}
}

// The names an authorized-keys file gives the two credentials that are not a
// PoP's (a PoP's name never starts with '_'): the operator's, which
// administers the streams (AdminPermissions), and the leaf links', which
// one region's NATS server logs in with at the hub's leaf listener and
// which relays every subject of the deployment between the regions.
const (
	AdminUser = "_admin"
	LeafUser  = "_leaf"
)

// PoPKey is a PoP's NATS nkey: its public half, which a server lets log in
// with the PoP's Permissions. POP AdminUser or LeafUser (Region "") is the
// operator's or the leaf links' key.
type PoPKey struct {
	Region, POP string
	// PublicKey is the nkey's public user key ("U...").
	PublicKey string
}

// ReadAuthorizedKeys reads an authorized-keys file as edgelimit natsconf
// writes it: one "<pop> <public user nkey>" per line, '#' starts a comment.
// Every PoP must be in t (which gives its region), at most once, with a valid
// public user key; AdminUser and LeafUser lines name the operator's and the
// leaf links' keys.
func ReadAuthorizedKeys(path string, t Topology) ([]PoPKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replication: authorized keys: %w", err)
	}
	defer f.Close()
	var out []PoPKey
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("replication: %s:%d: want \"<pop> <public nkey>\", got %q", path, n, strings.TrimSpace(line))
		}
		pop, key := fields[0], fields[1]
		region := t.RegionOf(pop)
		if pop == AdminUser || pop == LeafUser {
			region = ""
		} else if region == "" {
			return nil, fmt.Errorf("replication: %s:%d: PoP %q is not in the topology", path, n, pop)
		}
		if seen[pop] {
			return nil, fmt.Errorf("replication: %s:%d: PoP %q is listed twice", path, n, pop)
		}
		if !nkeys.IsValidPublicUserKey(key) {
			return nil, fmt.Errorf("replication: %s:%d: %q is not a public user nkey (U...); give the public key, never the seed", path, n, key)
		}
		seen[pop] = true
		out = append(out, PoPKey{Region: region, POP: pop, PublicKey: key})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("replication: %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("replication: %s lists no PoP", path)
	}
	return out, nil
}

// nkeyUsers returns the server's users for keys, each with its PoP's
// Permissions; the admin with AdminPermissions, and the leaf links' key
// without restriction (a leaf link relays every subject).
func nkeyUsers(keys []PoPKey) []*server.NkeyUser {
	out := make([]*server.NkeyUser, 0, len(keys))
	for _, k := range keys {
		var pub, sub []string
		switch k.POP {
		case LeafUser:
			out = append(out, &server.NkeyUser{Nkey: k.PublicKey, AllowedConnectionTypes: leafOnly})
			continue
		case AdminUser:
			pub, sub = AdminPermissions()
		default:
			pub, sub = Permissions(k)
		}
		perms := &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: pub},
			Subscribe: &server.SubjectPermission{Allow: sub},
		}
		if k.POP != AdminUser {
			// allow_responses: true, with nats-server's defaults (one
			// reply per request, within two minutes): Permissions.
			perms.Response = &server.ResponsePermission{}
		}
		out = append(out, &server.NkeyUser{Nkey: k.PublicKey, Permissions: perms, AllowedConnectionTypes: clientsOnly})
	}
	return out
}

// The connection types each key may log in with (nats-server's
// allowed_connection_types; the names are the jwt package's). The leaf key
// links regions and nothing else; a PoP's or the admin's key is a client's,
// over TCP or in process. Without them the server let any listed key in by
// either door: a PoP's own seed linked a region as a leaf, a link that
// carried that PoP's permissions, and the leaf key, which has none, could
// connect as a client.
var (
	leafOnly    = map[string]struct{}{"LEAFNODE": {}}
	clientsOnly = map[string]struct{}{"STANDARD": {}, "IN_PROCESS": {}}
)

// ErrOpenServer is returned by StartServer for a server that would listen
// beyond loopback and let anyone in: give it ServerConfig.Users.
var ErrOpenServer = errors.New("replication: refusing to serve NATS beyond loopback without credentials")

// isLoopback says whether host (an IP or a name) only ever reaches this
// machine. "localhost" is; "" and unspecified addresses (0.0.0.0, ::) are not.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
