package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/httpapi"
	"github.com/edgelimit/edgelimit/pop/quota"
)

// QuotaConfig is the tenant quota part of a PoP's Config.
type QuotaConfig struct {
	// Quotas is the quota store: "" or "embedded" for the embedded store
	// under DataDir/quotas, or a postgres:// URL.
	Quotas string
	// QuotasPoll is how often the PoP asks PostgreSQL for changes besides
	// LISTEN/NOTIFY; 0 means quota.DefaultPoll.
	QuotasPoll time.Duration
	// QuotasStartTimeout bounds the first load at start; past it the PoP
	// enforces its last snapshot and keeps trying. 0 means 5s.
	QuotasStartTimeout time.Duration
	// AdminListen, when set, is the address of the admin API, which needs
	// AdminToken as a bearer token.
	AdminListen string
	AdminToken  string
	// AdminReady, when set with AdminListen, receives the admin address.
	AdminReady chan<- net.Addr
	// QuotasSynced, when set, is called with the quota version each time
	// the PoP's in-memory quotas change (tests measure propagation by it).
	QuotasSynced func(version int64)
}

// isPostgres reports whether s names a PostgreSQL quota store.
func isPostgres(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// startQuotas opens the quota store, loads every quota into the engine's
// index (or the last snapshot when PostgreSQL does not answer), follows
// changes until ctx ends, and serves the admin API when configured. stop
// closes what it started; errc receives the admin server's failure.
func startQuotas(ctx context.Context, cfg Config, eng *pop.Engine, reg prometheus.Registerer, log *slog.Logger) (stop func(), errc <-chan error, err error) {
	qc := cfg.QuotaConfig
	var st quota.Store
	var snapshot string
	switch {
	case (qc.Quotas == "" || qc.Quotas == "embedded") && cfg.DataDir == "":
		// Nowhere to keep quotas (tests, a throwaway PoP): tiers apply with
		// their default tier only.
		if qc.AdminListen != "" {
			return nil, nil, errors.New("--admin-listen with the embedded quota store needs a data directory (--data)")
		}
		return func() {}, nil, nil
	case qc.Quotas == "" || qc.Quotas == "embedded":
		f, err := quota.OpenFile(filepath.Join(cfg.DataDir, "quotas"))
		if err != nil {
			return nil, nil, err
		}
		st = f
	case isPostgres(qc.Quotas):
		p, err := quota.NewPostgres(qc.Quotas)
		if err != nil {
			return nil, nil, err
		}
		st = p
		if cfg.DataDir != "" {
			snapshot = filepath.Join(cfg.DataDir, "quotas-snapshot.bin")
			// Releases before the binary snapshot saved it as JSON under
			// another name. quota.ReadSnapshot reads either form, so the
			// old file is moved, not converted; the next save is binary.
			old := filepath.Join(cfg.DataDir, "quotas-snapshot.json")
			if _, err := os.Stat(snapshot); errors.Is(err, os.ErrNotExist) {
				if err := os.Rename(old, snapshot); err == nil {
					log.Info("quotas: moved the JSON snapshot of an older release", "from", old, "to", snapshot)
				}
			}
		}
	default:
		return nil, nil, fmt.Errorf("--quotas %q: want embedded or a postgres:// URL", quota.RedactURL(qc.Quotas))
	}
	idx := &quota.Index{}
	syncer := &quota.Syncer{Store: st, Index: idx, SnapshotPath: snapshot, Poll: qc.QuotasPoll, Logger: log, Synced: qc.QuotasSynced}
	timeout := qc.QuotasStartTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if err := syncer.Start(ctx, timeout); err != nil {
		st.Close()
		return nil, nil, err
	}
	eng.UseQuotas(idx)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "edgelimit_quotas", Help: "API keys with a quota held in memory."},
			func() float64 { return float64(idx.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "edgelimit_quotas_version", Help: "The quota store version (last audit id) this PoP enforces."},
			func() float64 { return float64(idx.Version()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "edgelimit_quota_store_up",
			Help: "1 while the quota store answers this PoP's reads (at start, then every poll and change); 0 while it does not: the quotas last read (or the snapshot file's) stay in force, and quota changes do not arrive."},
			func() float64 {
				if syncer.Reachable() {
					return 1
				}
				return 0
			}),
	)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); syncer.Run(sctx) }()
	log.Info("quotas", "store", storeKind(qc.Quotas), "quotas", idx.Len(), "version", idx.Version())

	errs := make(chan error, 1)
	var srv *http.Server
	if qc.AdminListen != "" {
		if qc.AdminToken == "" {
			cancel()
			<-done
			st.Close()
			return nil, nil, errors.New("--admin-listen needs --admin-token-file")
		}
		ln, err := net.Listen("tcp", qc.AdminListen)
		if err != nil {
			cancel()
			<-done
			st.Close()
			return nil, nil, fmt.Errorf("admin listen: %w", err)
		}
		srv = &http.Server{
			Handler:           httpapi.NewAdmin(httpapi.AdminConfig{Store: st, Engine: eng, Token: qc.AdminToken, Logger: log}),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("admin: %w", err)
			}
		}()
		log.Info("admin API serving", "listen", ln.Addr().String())
		if qc.AdminReady != nil {
			qc.AdminReady <- ln.Addr()
		}
	}
	return func() {
		if srv != nil {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Shutdown(sctx)
			scancel()
		}
		cancel()
		<-done
		st.Close()
	}, errs, nil
}

func storeKind(s string) string {
	if isPostgres(s) {
		return quota.RedactURL(s)
	}
	return "embedded"
}
