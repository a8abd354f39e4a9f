package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// ConnConfig says how a PoP connects to NATS: to its embedded server (just
// URL), or to an external cluster with credentials and TLS. Set at most one
// of user/password, Token, NKeySeedFile and CredsFile.
type ConnConfig struct {
	// URL is one NATS URL or several, comma-separated (nats://host:4222,
	// tls://host:4222).
	URL string
	// Name names the connection in the servers' monitoring; the PoP's name,
	// say.
	Name string
	// User and Password authenticate with a user name and password.
	User, Password string
	// Token authenticates with a token.
	Token string
	// NKeySeedFile authenticates with the nkey seed in that file.
	NKeySeedFile string
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

// Connect connects to NATS as cfg says. The connection retries forever,
// also when no server answers at first (Connect then returns a connection
// that is still connecting): a PoP never waits on NATS to serve checks, and
// replication catches up once NATS is there. It returns an error for a
// config it cannot use (no URL, two kinds of credentials, an unreadable
// nkey seed).
func Connect(cfg ConnConfig) (*nats.Conn, error) {
	if cfg.URL == "" {
		return nil, errors.New("replication: no NATS URL")
	}
	kinds := 0
	for _, set := range []bool{cfg.User != "" || cfg.Password != "", cfg.Token != "", cfg.NKeySeedFile != "", cfg.CredsFile != ""} {
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
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("replication: disconnected from NATS", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("replication: connected to NATS", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
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
		opts = append(opts, o)
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
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
		return nil, fmt.Errorf("replication: connect to NATS at %s: %w", cfg.URL, err)
	}
	return nc, nil
}
