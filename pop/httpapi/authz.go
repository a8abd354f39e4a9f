package httpapi

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// handleAuthz answers a forward-auth sub-request. The domain comes from the
// X-Edgelimit-Domain header, which the proxy sets, else it is the one domain
// whose rule file has a forward_auth section. (Not from the query string:
// behind Envoy's ext_authz the query is the client's own, and a client must
// not choose which limits hold it.) Its descriptors are built
// from the sub-request's headers (rules.AuthEntry). An allowed request gets 200
// with the rate limit headers and no body; a denied one gets the domain's
// deny_status (429 by default, 403 for nginx) with the headers and the JSON
// error body. A store failure fails open: 200, logged.
func (s *Server) handleAuthz(w http.ResponseWriter, r *http.Request) {
	set := s.cfg.Engine.Rules()
	name := r.Header.Get("X-Edgelimit-Domain")
	var dom *rules.Domain
	if name != "" {
		dom = set.Domain(name)
		if dom == nil || dom.ForwardAuth == nil {
			s.badRequest(w, "authz", "domain", "domain "+name+" has no forward_auth section in the rules")
			return
		}
	} else {
		for _, d := range set.Domains() {
			if d.ForwardAuth == nil {
				continue
			}
			if dom != nil {
				s.badRequest(w, "authz", "domain", "several domains have forward_auth; the proxy must name one in the X-Edgelimit-Domain header")
				return
			}
			dom = d
		}
		if dom == nil {
			s.badRequest(w, "authz", "domain", "no domain has a forward_auth section in the rules")
			return
		}
	}

	st := s.getState()
	defer s.putState(st)
	st.req = pop.Request{Domain: dom.Name, Descriptors: st.req.Descriptors[:0]}
	for _, entries := range dom.ForwardAuth.Descriptors {
		d, ok := s.deriveDescriptor(r, entries)
		if ok {
			st.req.Descriptors = append(st.req.Descriptors, d)
		}
	}
	if len(st.req.Descriptors) == 0 { // nothing to limit this request by
		w.WriteHeader(http.StatusOK)
		return
	}
	now := s.cfg.Now()
	err := s.cfg.Engine.CheckAt(r.Context(), now, &st.req, &st.res)
	s.cfg.Metrics.ObserveCheck("authz", s.cfg.Now().Sub(now))
	if err != nil {
		var re *pop.RequestError
		if errors.As(err, &re) { // e.g. a header value over the size bound
			s.checkFailed(w, "authz", err)
			return
		}
		s.cfg.Logger.Error("forward auth check failed; allowing", "err", err)
		w.WriteHeader(http.StatusOK)
		return
	}
	s.setHeaders(w.Header(), now, &st.res)
	if st.res.Code != pop.OverLimit {
		w.WriteHeader(http.StatusOK)
		return
	}
	status := dom.ForwardAuth.DenyStatus
	if status == 0 {
		status = http.StatusTooManyRequests
	}
	st.out = appendProblem(st.out[:0], status, &st.req, &st.res)
	writeProblem(w, status, st.out)
}

func (s *Server) deriveDescriptor(r *http.Request, entries []rules.AuthEntry) (pop.Descriptor, bool) {
	d := pop.Descriptor{Entries: make([]rules.Entry, 0, len(entries))}
	for _, e := range entries {
		v := e.Value
		if e.From != "" {
			v = s.authValue(r, e.From)
		}
		if v == "" {
			return d, false
		}
		d.Entries = append(d.Entries, rules.Entry{Key: e.Key, Value: v})
	}
	return d, true
}

// authValue reads one forward-auth source from the sub-request.
func (s *Server) authValue(r *http.Request, from string) string {
	switch from {
	case "client_ip":
		return clientIP(r, s.cfg.ClientIPHeader)
	case "method":
		return originalMethod(r)
	case "path":
		return originalPath(r)
	case "method_path":
		return originalMethod(r) + " " + originalPath(r)
	case "host":
		if h := r.Header.Get("X-Forwarded-Host"); h != "" {
			return h
		}
		return r.Host
	}
	if name, ok := strings.CutPrefix(from, "header:"); ok {
		return r.Header.Get(name)
	}
	return ""
}

// clientIP is the last address in header (canonical), the one the proxy in
// front of us appended or wrote, which a client cannot forge, unlike the
// first; else the peer address. No other header counts: a proxy that passes
// a client's X-Real-IP through would let the client choose its key.
func clientIP(r *http.Request, header string) string {
	if vs := r.Header[header]; len(vs) > 0 {
		last := vs[len(vs)-1]
		if i := strings.LastIndexByte(last, ','); i >= 0 {
			last = last[i+1:]
		}
		if ip := strings.TrimSpace(last); ip != "" {
			return ip
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func originalMethod(r *http.Request) string {
	for _, h := range [...]string{"X-Original-Method", "X-Forwarded-Method"} {
		if m := r.Header.Get(h); m != "" {
			return m
		}
	}
	return r.Method
}

// originalPath is the original request's path without its query: from
// X-Original-URI (nginx), X-Forwarded-Uri (Traefik), or the sub-request's own
// path after /v1/authz (Envoy ext_authz appends the original path to its
// path_prefix).
func originalPath(r *http.Request) string {
	for _, h := range [...]string{"X-Original-URI", "X-Forwarded-Uri"} {
		if u := r.Header.Get(h); u != "" {
			if p, err := url.ParseRequestURI(u); err == nil {
				return p.Path
			}
			p, _, _ := strings.Cut(u, "?")
			return p
		}
	}
	return trimPrefixPath(r.URL.Path)
}
