package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ConnConfig says how a PoP connects to NATS: to its embedded server (just
// URL), or to an external cluster with credentials and TLS. Set at most one
// of user/password, Token, NKeySeedFile and CredsFile.
type ConnConfig struct {
	// URL is one NATS URL or several, comma-separated (nats://host:4222,
	// tls://host:4222).
	URL string
	// InProcess, when set, connects to this embedded server in process,
	// with no TCP (a server StartServer started without a client port);
	// URL may then be empty.
	InProcess nats.InProcessConnProvider
	// Name names the connection in the servers' monitoring; the PoP's name,
	// say.
	Name string
	// User and Password authenticate with a user name and password.
	User, Password string
	// Token authenticates with a token.
	Token string
	// NKeySeedFile authenticates with the nkey seed in that file.
	NKeySeedFile string
	// NKey authenticates with an nkey held in memory: the embedded server's
	// in-process admin (ServerConfig.Admin), whose seed is never written.
	NKey nkeys.KeyPair
	// CredsFile authenticates with a decentralized-auth credentials file
	// (user JWT and nkey seed).
	CredsFile string
	// CAFile verifies the servers' TLS certificates with these roots
	// instead of the system's; CertFile and KeyFile present a client
	// certificate. Setting any of them requires TLS.
	CAFile, CertFile, KeyFile string
	// Logger receives disconnects, reconnects and asynchronous errors; nil
	// means slog.Default().
	Logger *slog.Logger
}

// MinServerVersion is the oldest nats-server replication works with. Older
// servers keep the Nats-Expected-Stream header, which every batch is
// published with, on the messages a stream sources from another region's
// stream, and the sourcing stream then rejects each one ("expected stream
// does not match"; nats-server 2.10.14 strips the header): counts would
// cross regions only by snapshots, and no metric would say so.
const MinServerVersion = "2.10.14"

// ErrServerTooOld is returned, wrapped with both versions, by Connect when
// the server is older than MinServerVersion.
var ErrServerTooOld = errors.New("nats-server too old for edgelimit replication")

// CheckServerVersion returns an error wrapping ErrServerTooOld, naming
// version and MinServerVersion, when version (a nats-server version such as
// "2.9.10" or "v2.11.0-RC.1") is older than MinServerVersion or cannot be
// read.
func CheckServerVersion(version string) error {
	have, ok := parseVersion(version)
	want, _ := parseVersion(MinServerVersion)
	if !ok {
		return fmt.Errorf("replication: %w: cannot read server version %q (need %s or later)", ErrServerTooOld, version, MinServerVersion)
	}
	for i := range have {
		if have[i] != want[i] {
			if have[i] < want[i] {
				return fmt.Errorf("replication: %w: the server is %s, edgelimit needs %s or later", ErrServerTooOld, version, MinServerVersion)
			}
			return nil
		}
	}
	return nil
}

// parseVersion reads major.minor.patch of a version, ignoring a leading "v"
// and any "-suffix".
func parseVersion(v string) ([3]int, bool) {
	var out [3]int
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}

// Connect connects to NATS as cfg says. The connection retries forever,
// also when no server answers at first (Connect then returns a connection
// that is still connecting): a PoP never waits on NATS to serve checks, and
// replication catches up once NATS is there. It returns an error for a
// config it cannot use (no URL, two kinds of credentials, an unreadable
// nkey seed), and one wrapping ErrServerTooOld when the server it reached is
// older than MinServerVersion. A server found too old on a later connect
// (the first answered after Connect returned, or a reconnect) is logged as
// an error and the connection closed, so replication stops visibly rather
// than half-working.
func Connect(cfg ConnConfig) (*nats.Conn, error) {
	if cfg.URL == "" && cfg.InProcess == nil {
		return nil, errors.New("replication: no NATS URL")
	}
	kinds := 0
	for _, set := range []bool{cfg.User != "" || cfg.Password != "", cfg.Token != "", cfg.NKeySeedFile != "", cfg.CredsFile != "", cfg.NKey != nil} {
		if set {
			kinds++
		}
	}
	if kinds > 1 {
		return nil, errors.New("replication: set only one of NATS user/password, token, nkey seed and credentials file")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	// The first connect's handler can run before nats.Connect returns, and
	// close a connection to a server too old: what it found is Connect's
	// error then.
	var tooOld atomic.Pointer[error]
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("replication: disconnected from NATS", "err", err)
		}),
		nats.ConnectHandler(func(nc *nats.Conn) { connected(nc, log, func(err error) { tooOld.CompareAndSwap(nil, &err) }) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { connected(nc, log, nil) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"$JS.API.CONSUMER.DELETE.`) {
				// The ordered consumer's delete of the consumer it
				// replaced, after a reset: a PoP's credential may not
				// delete consumers (Permissions), and the server drops
				// the old one after its inactive threshold.
				log.Debug("replication: consumer delete refused by the credential; the server expires it", "err", err)
				return
			}
			log.Warn("replication: NATS error", "subject", subject, "err", err)
		}),
	}
	switch {
	case cfg.User != "" || cfg.Password != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("replication: NATS nkey seed %s: %w", cfg.NKeySeedFile, err)
		}
		pub, err := seedPublicKey(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("replication: NATS nkey seed %s: %w", cfg.NKeySeedFile, err)
		}
		// Its own inboxes: the only ones a PoP's nkey may read (Permissions).
		opts = append(opts, o, nats.CustomInboxPrefix(InboxPrefix(pub)))
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.NKey != nil:
		pub, err := cfg.NKey.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("replication: NATS nkey: %w", err)
		}
		opts = append(opts, nats.Nkey(pub, cfg.NKey.Sign), nats.CustomInboxPrefix(InboxPrefix(pub)))
	}
	if cfg.InProcess != nil {
		opts = append(opts, nats.InProcessServer(cfg.InProcess))
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("replication: a NATS client certificate needs both a certificate and a key file")
	}
	if cfg.CertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		where := cfg.URL
		if cfg.InProcess != nil {
			where = "the embedded server, in process"
		}
		return nil, fmt.Errorf("replication: connect to NATS at %s: %w", where, err)
	}
	if nc.IsConnected() {
		if err := CheckServerVersion(nc.ConnectedServerVersion()); err != nil {
			url := nc.ConnectedUrlRedacted()
			nc.Close()
			return nil, fmt.Errorf("%w (at %s)", err, url)
		}
	}
	if e := tooOld.Load(); e != nil && nc.IsClosed() {
		return nil, *e
	}
	return nc, nil
}

// seedPublicKey returns the public key of the nkey seed in file.
func seedPublicKey(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return "", err
	}
	return kp.PublicKey()
}

// connected runs when nc (re)connects, possibly before Connect returned:
// it logs the server, or, when the server is too old, tells tooOld (if not
// nil) the error and closes nc.
func connected(nc *nats.Conn, log *slog.Logger, tooOld func(error)) {
	if nc.IsClosed() { // Connect found the server too old
		return
	}
	if err := CheckServerVersion(nc.ConnectedServerVersion()); err != nil {
		url := nc.ConnectedUrlRedacted()
		log.Error("replication: closing the NATS connection; replication stops", "url", url, "err", err)
		if tooOld != nil {
			tooOld(fmt.Errorf("%w (at %s)", err, url)) // before Close: Connect reads it once nc is closed
		}
		nc.Close()
		return
	}
	log.Info("replication: connected to NATS", "url", nc.ConnectedUrlRedacted(), "server_version", nc.ConnectedServerVersion())
}
