package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// Warning is a problem in a rule file that does not stop it from loading,
// such as an Envoy field that edgelimit ignores.
type Warning struct {
	File string
	Line int // 0 when the warning is about the whole file
	Msg  string
}

// String formats the warning as "file:line: message".
func (w Warning) String() string { return where(w.File, w.Line) + w.Msg }

// Error is a problem in a rule file that stops the rule set from loading.
type Error struct {
	File string
	Line int // 0 when the error is about the whole file
	Msg  string
}

// Error formats the error as "file:line: message".
func (e *Error) Error() string { return where(e.File, e.Line) + e.Msg }

func where(file string, line int) string {
	if line > 0 {
		return file + ":" + strconv.Itoa(line) + ": "
	}
	return file + ": "
}

const (
	// maxFileSize bounds one rule file; rule files are hand-written and small.
	maxFileSize = 16 << 20
	// maxErrors is how many errors one file reports before giving up.
	maxErrors = 20
	// maxDepth bounds the nesting of descriptors and of YAML merge keys.
	maxDepth = 64
	// maxWork bounds the mappings and aliases walked in one file, so that
	// YAML aliases (which may even form cycles) cannot make a small file
	// expand without bound.
	maxWork = 1 << 18
)

// Envoy ratelimit fields that edgelimit accepts and ignores, with a warning:
// metric naming (detailed_metric, value_to_metric).
var envoyDescriptorFields = []string{"detailed_metric", "value_to_metric"}

// Options change how rule files load.
type Options struct {
	// MergeDomains lets several files define one domain: their descriptors
	// are joined into one tree, as Envoy's ratelimit does with
	// MERGE_DOMAIN_CONFIG. A descriptor defined twice is still an error.
	// Without it, a domain defined in two files is an error.
	MergeDomains bool
	// DefaultAlgorithm is the algorithm of a limit whose rule names none
	// (the zero value is limit.SlidingWindow; Envoy's ratelimit counts
	// fixed windows).
	DefaultAlgorithm limit.Algorithm
	// QuotaMode puts every rate limit in quota mode, as Envoy's ratelimit's
	// QUOTA_MODE does (see Limit.QuotaMode).
	QuotaMode bool
}

// Load reads rule files and builds a Set. Each path is a file or a directory;
// a directory contributes its *.yaml and *.yml files in name order, not
// recursively, skipping names that start with "." (such as the ..data entries
// of a Kubernetes ConfigMap mount). Every file holds one domain in the format
// of Envoy's ratelimit service plus edgelimit's extensions (see the package
// documentation and deploy/examples/rules.yaml).
//
// Fields that only Envoy implements load with a Warning. Everything else that
// is wrong — bad YAML, an unknown field, a missing key, an unknown unit,
// algorithm or scope, an invalid limit, duplicate sibling descriptors, two
// files with the same domain, an unreadable path — is an error naming the file
// and line; errors of several files are joined. On error the Set is nil and
// the warnings found so far are still returned. Load never panics.
func Load(paths ...string) (*Set, []Warning, error) {
	return LoadWith(Options{}, paths...)
}

// LoadWith is Load with options.
func LoadWith(o Options, paths ...string) (*Set, []Warning, error) {
	files, warns, err := readFiles(paths)
	if err != nil {
		return nil, warns, err
	}
	set, w, err := build(files, o)
	return set, append(warns, w...), err
}

// ruleFile is one rule file's name and contents.
type ruleFile struct {
	name string
	data []byte
}

// listFiles expands path into the rule files it names: the path itself when
// it is a regular file (any other non-directory is an error), else the
// directory's rule files in name order. Entries of a directory that are not
// regular files (FIFOs, sockets, devices, dangling symlinks) are skipped with
// a warning, as is a directory without rule files.
func listFiles(path string) ([]string, []Warning, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() { // named explicitly: an error, not a hang
			return nil, nil, fmt.Errorf("not a regular file (%s)", fileType(fi.Mode()))
		}
		return []string{path}, nil, nil
	}
	entries, err := os.ReadDir(path) // sorted by name
	if err != nil {
		return nil, nil, err
	}
	var out []string
	var warns []Warning
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		p := filepath.Join(path, n)
		// Stat follows symlinks: ConfigMap files are links into ..data.
		fi, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// A dangling symlink, or a file removed since ReadDir.
			warns = append(warns, Warning{File: p, Msg: "skipped: it does not exist (a dangling symlink?)"})
			continue
		case err != nil:
			return nil, warns, err
		case fi.IsDir():
			continue
		case !fi.Mode().IsRegular():
			// Opening a FIFO would block until a writer comes; a socket
			// cannot be opened; neither is a rule file.
			warns = append(warns, Warning{File: p, Msg: "skipped: not a regular file (" + fileType(fi.Mode()) + ")"})
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		warns = append(warns, Warning{File: path, Msg: "directory holds no *.yaml or *.yml rule files"})
	}
	return out, warns, nil
}

// fileType names the type of a file that is not regular.
func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}

// readFiles lists and reads the rule files of paths.
func readFiles(paths []string) ([]ruleFile, []Warning, error) {
	var files []ruleFile
	var warns []Warning
	for _, p := range paths {
		names, w, err := listFiles(p)
		warns = append(warns, w...)
		if err != nil {
			return nil, warns, fmt.Errorf("rule path %s: %w", p, err)
		}
		for _, n := range names {
			data, err := readFile(n)
			if err != nil {
				return nil, warns, err
			}
			files = append(files, ruleFile{n, data})
		}
	}
	return files, warns, nil
}

func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("rule file %s: %w", name, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("rule file %s: %w", name, err)
	}
	if len(data) > maxFileSize {
		return nil, &Error{File: name, Msg: fmt.Sprintf("file is larger than %d bytes", maxFileSize)}
	}
	return data, nil
}

// build parses files and assembles the Set. Each file is checked completely,
// so one run reports the errors of every file.
func build(files []ruleFile, o Options) (*Set, []Warning, error) {
	var (
		domains []*Domain
		warns   []Warning
		errs    []error
		seen    = map[string]*Domain{}
	)
	for _, f := range files {
		d, w, fileErrs := parseFile(f.name, f.data, o)
		warns = append(warns, w...)
		if len(fileErrs) > 0 {
			errs = append(errs, fileErrs...)
			continue
		}
		if first, dup := seen[d.Name]; dup {
			if !o.MergeDomains {
				errs = append(errs, &Error{File: f.name, Msg: fmt.Sprintf("domain %q is already defined in %s; one file per domain (or merge them with --merge-domains)", d.Name, first.File)})
				continue
			}
			if err := first.merge(d); err != nil {
				errs = append(errs, &Error{File: f.name, Msg: err.Error()})
			}
			continue
		}
		seen[d.Name] = d
		domains = append(domains, d)
	}
	for _, d := range domains {
		d.resolveReplaces()
	}
	if len(errs) > 0 {
		return nil, warns, errors.Join(errs...)
	}
	set, err := NewSet(domains...)
	if err != nil { // unreachable: names were checked above
		return nil, warns, err
	}
	return set, warns, nil
}

// yamlLine matches the line that yaml puts into its syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlParserProblems are the problems of yaml's parser (as opposed to its
// scanner). yaml reports their line as the line where the enclosing block or
// flow collection starts, counted from 0 — which may be many lines before the
// mistake — so yamlError looks for the mistake's own line (problemLine).
var yamlParserProblems = []string{
	"did not find expected ',' or ",
	"did not find expected '-' indicator",
	"did not find expected <",
	"did not find expected key",
	"did not find expected node content",
	"found duplicate %",
	"found incompatible YAML document",
	"found undefined tag handle",
}

// yamlError turns a yaml syntax error of data into an Error with the line of
// the mistake.
func yamlError(file string, data []byte, err error) *Error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		for _, prefix := range yamlParserProblems {
			if strings.HasPrefix(m[2], prefix) {
				line = problemLine(data, line+1)
				break
			}
		}
		return &Error{File: file, Line: line, Msg: "invalid YAML: " + m[2]}
	}
	return &Error{File: file, Msg: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// problemLine returns the line of data's syntax error, or fallback when it
// cannot tell. The first k lines of a block-style document that stop before
// the mistake are themselves valid YAML, or fail only for ending early; from
// the mistake's line on, every prefix fails. So the mistake's line is the
// shortest prefix that fails otherwise, found by bisection (a few parses of
// a file that is already known to be bad).
func problemLine(data []byte, fallback int) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	fails := func(k int) bool {
		var v any
		err := yaml.Unmarshal(bytes.Join(lines[:k], nil), &v)
		return err != nil && !strings.Contains(err.Error(), "end of stream")
	}
	if !fails(len(lines)) {
		return fallback
	}
	ok, bad := 0, len(lines) // fails(bad), and not fails(ok)
	for ok+1 < bad {
		if mid := (ok + bad) / 2; fails(mid) {
			bad = mid
		} else {
			ok = mid
		}
	}
	return bad
}

// parseFile parses one rule file into a Domain.
func parseFile(name string, data []byte, o Options) (*Domain, []Warning, []error) {
	p := &parser{file: name, opts: o}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case err == io.EOF:
		return nil, nil, []error{&Error{File: name, Msg: "file is empty; want a domain and descriptors"}}
	case err != nil:
		return nil, nil, []error{yamlError(name, data, err)}
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		return nil, nil, []error{&Error{File: name, Line: extra.Line, Msg: "a second YAML document; a rule file holds one domain"}}
	case err != io.EOF:
		return nil, nil, []error{yamlError(name, data, err)}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	d := p.domain(root)
	if len(p.errs) > 0 {
		return nil, p.warns, p.errs
	}
	return d, p.warns, nil
}

// parser walks one file's yaml.Node tree, collecting errors and warnings
// with their lines.
type parser struct {
	file   string
	opts   Options
	errs   []error
	warns  []Warning
	work   int
	limits []*Limit // in file order, for naming
	named  []bool   // limits[i] has a configured name
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	if len(p.errs) == maxErrors {
		p.errs = append(p.errs, &Error{File: p.file, Msg: "too many errors; stopping"})
	}
	if len(p.errs) > maxErrors {
		return
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line(n), Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) warnf(n *yaml.Node, format string, args ...any) {
	p.warns = append(p.warns, Warning{File: p.file, Line: line(n), Msg: fmt.Sprintf(format, args...)})
}

func line(n *yaml.Node) int {
	if n == nil {
		return 0
	}
	return n.Line
}

// spend counts work against maxWork and reports whether the walk goes on:
// it stops when the work or the error count runs out.
func (p *parser) spend(n *yaml.Node) bool {
	p.work++
	if p.work == maxWork {
		p.errorf(n, "document is too large once its aliases are expanded")
	}
	return p.work < maxWork && len(p.errs) <= maxErrors
}

// resolve follows aliases.
func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		if !p.spend(n) {
			return nil
		}
		n = n.Alias
	}
	return n
}

// field is one key: value pair of a mapping.
type field struct {
	key, val *yaml.Node
}

// mapping returns the pairs of the mapping n, described as what in messages.
// Keys must be in allowed, or in ignored (which warns that edgelimit ignores
// them). YAML merge keys ("<<") are honoured. It returns nil and reports an
// error when n is not a mapping.
func (p *parser) mapping(n *yaml.Node, what string, allowed, ignored []string) map[string]field {
	out := map[string]field{}
	if !p.mergeInto(out, n, what, allowed, ignored, true, 0) {
		return nil
	}
	return out
}

func (p *parser) mergeInto(out map[string]field, n *yaml.Node, what string, allowed, ignored []string, explicit bool, depth int) bool {
	at := n
	n = p.resolve(n)
	if n == nil || !p.spend(at) {
		return false
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(at, "%s must be a mapping, got %s", what, kind(n))
		return false
	}
	if depth > maxDepth {
		p.errorf(at, "%s: merge keys nest deeper than %d", what, maxDepth)
		return false
	}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, "%s has a key that is not a string", what)
			continue
		}
		if k.Value == "<<" && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		if f, dup := out[k.Value]; dup {
			if explicit {
				p.errorf(k, "duplicate field %q in %s (first at line %d)", k.Value, what, f.key.Line)
			}
			continue // explicit keys win over merged ones
		}
		switch {
		case slices.Contains(allowed, k.Value):
		case slices.Contains(ignored, k.Value):
			if explicit {
				p.warnf(k, "%s is not implemented by edgelimit and is ignored", k.Value)
			}
		default:
			p.errorf(k, "unknown field %q in %s", k.Value, what)
			continue
		}
		out[k.Value] = field{k, v}
	}
	for _, m := range merges {
		src := p.resolve(m)
		if src != nil && src.Kind == yaml.SequenceNode {
			for _, s := range src.Content {
				if !p.mergeInto(out, s, what, allowed, ignored, false, depth+1) {
					return false
				}
			}
		} else if !p.mergeInto(out, m, what, allowed, ignored, false, depth+1) {
			return false
		}
	}
	return true
}

func kind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

// str returns the string value of the scalar f.val; null is "".
func (p *parser) str(f field, what string) (string, bool) {
	n := p.resolve(f.val)
	if n == nil {
		return "", false
	}
	if n.Kind != yaml.ScalarNode {
		p.errorf(f.val, "%s must be a string, got %s", what, kind(n))
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// integer returns the integer value of f.val.
func (p *parser) integer(f field, what string) (int64, bool) {
	n := p.resolve(f.val)
	var v int64
	if n == nil {
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" || n.Decode(&v) != nil {
		p.errorf(f.val, "%s must be an integer, got %s", what, kind(n))
		return 0, false
	}
	return v, true
}

// boolean returns the boolean value of f.val; YAML 1.1's yes/no/on/off are
// accepted as Envoy's YAML library does.
func (p *parser) boolean(f field, what string) (bool, bool) {
	n := p.resolve(f.val)
	var v bool
	if n == nil {
		return false, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" || n.Decode(&v) != nil {
		p.errorf(f.val, "%s must be true or false, got %s", what, kind(n))
		return false, false
	}
	return v, true
}

// list returns the items of the sequence f.val; null is an empty list.
func (p *parser) list(f field, what string) ([]*yaml.Node, bool) {
	n := p.resolve(f.val)
	if n == nil {
		return nil, false
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil, true
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(f.val, "%s must be a list, got %s", what, kind(n))
		return nil, false
	}
	return n.Content, true
}

// domain parses the top level of a rule file.
func (p *parser) domain(n *yaml.Node) *Domain {
	m := p.mapping(n, "the rule file", []string{"domain", "descriptors", "forward_auth", "tenants"}, nil)
	if m == nil {
		return nil
	}
	f, ok := m["domain"]
	if !ok {
		p.errorf(n, "domain is required")
		return nil
	}
	name, ok := p.str(f, "domain")
	if !ok {
		return nil
	}
	if name == "" {
		p.errorf(f.key, "domain must not be empty")
		return nil
	}
	root := &Node{}
	if f, ok := m["descriptors"]; ok {
		items, _ := p.list(f, "descriptors")
		p.descriptors(items, "", root, 1, nil)
	}
	d := NewDomain(name, p.file, root)
	if f, ok := m["forward_auth"]; ok {
		d.ForwardAuth = p.forwardAuth(f)
	}
	if f, ok := m["tenants"]; ok {
		d.Tenants = p.tenants(f)
	}
	p.nameLimits()
	if d.Tenants != nil {
		d.Tenants.finish(root)
	}
	for _, l := range p.limits {
		l.Domain = name
	}
	return d
}

// descriptors parses one descriptor list below node, whose path is path.
//
// shared holds, for each level above, the wildcard value whose matches share
// one counter (share_threshold), or "".
func (p *parser) descriptors(items []*yaml.Node, path string, node *Node, depth int, shared []string) {
	type sibling struct{ key, value string }
	seen := map[sibling]int{}
	for _, item := range items {
		if depth > maxDepth {
			p.errorf(item, "descriptors nest deeper than %d levels", maxDepth)
			return
		}
		m := p.mapping(item, "descriptor", []string{"key", "value", "rate_limit", "rate_limits", "shadow_mode", "quota_mode", "share_threshold", "descriptors", "concurrency", "metadata"}, envoyDescriptorFields)
		if m == nil {
			continue
		}
		var key, value string
		if f, ok := m["key"]; !ok {
			p.errorf(item, "descriptor has no key")
			continue
		} else if key, ok = p.str(f, "key"); !ok {
			continue
		} else if key == "" {
			p.errorf(f.val, "descriptor key must not be empty")
			continue
		}
		if f, ok := m["value"]; ok {
			if value, ok = p.str(f, "value"); !ok {
				continue
			}
		}
		if first, dup := seen[sibling{key, value}]; dup {
			p.errorf(item, "duplicate descriptor key %q value %q (first at line %d)", key, value, first)
			continue
		}
		seen[sibling{key, value}] = line(item)

		childPath := key
		if path != "" {
			childPath = path + "." + key
		}
		if value != "" {
			childPath += "=" + value
		}
		// Every descriptor gets its node, even one without limits: as in
		// Envoy, a configured value without a limit shadows the key-only
		// descriptor beside it (it "whitelists" that value).
		child := node.Child(key, value)

		shadow, quota := false, false
		if f, ok := m["shadow_mode"]; ok {
			shadow, _ = p.boolean(f, "shadow_mode")
		}
		if f, ok := m["quota_mode"]; ok {
			quota, _ = p.boolean(f, "quota_mode")
		}
		quota = quota || p.opts.QuotaMode
		var meta map[string]any
		if f, ok := m["metadata"]; ok {
			meta = p.metadata(f)
		}
		share := ""
		if f, ok := m["share_threshold"]; ok {
			if on, _ := p.boolean(f, "share_threshold"); on {
				if !strings.Contains(value, "*") {
					p.errorf(f.key, "share_threshold applies to a wildcard value (one holding '*'), got value %q", value)
				}
				share = value
			}
		}
		levels := append(slices.Clip(shared), share)
		for _, l := range p.descriptorLimits(m, childPath, child, shadow, quota, levels) {
			l.Metadata = meta
		}
		if f, ok := m["concurrency"]; ok {
			p.concurrency(f, childPath, child, shadow)
		}
		if f, ok := m["descriptors"]; ok {
			sub, _ := p.list(f, "descriptors")
			p.descriptors(sub, childPath, child, depth+1, levels)
		}
	}
}

// descriptorLimits parses rate_limit or rate_limits of one descriptor, adds
// the limits to node and returns them.
func (p *parser) descriptorLimits(m map[string]field, path string, node *Node, shadow, quota bool, shared []string) []*Limit {
	one, hasOne := m["rate_limit"]
	many, hasMany := m["rate_limits"]
	var objs []field
	switch {
	case hasOne && hasMany:
		p.errorf(many.key, "a descriptor has rate_limit or rate_limits, not both")
		return nil
	case hasOne:
		if n := p.resolve(one.val); n != nil && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
			p.warnf(one.key, "rate_limit is empty and is ignored")
			return nil
		}
		objs = []field{one}
	case hasMany:
		items, ok := p.list(many, "rate_limits")
		if !ok {
			return nil
		}
		if len(items) == 0 {
			p.errorf(many.key, "rate_limits must list at least one limit")
			return nil
		}
		for _, it := range items {
			objs = append(objs, field{it, it})
		}
	default:
		return nil
	}

	type counter struct {
		alg    limit.Algorithm
		window time.Duration
		scope  Scope
	}
	seen := map[counter]int{}
	var limits []*Limit
	var named []bool
	for _, f := range objs {
		l, hasName, ok := p.rateLimit(f)
		if !ok {
			continue
		}
		l.Path, l.Shadow, l.QuotaMode = path, shadow, quota
		if slices.ContainsFunc(shared, func(s string) bool { return s != "" }) {
			l.Shared = shared
		}
		if l.Unlimited && len(objs) > 1 {
			p.errorf(f.key, "an unlimited limit cannot share a descriptor with other limits")
			continue
		}
		c := counter{l.Spec.Algorithm, l.Window(), l.Scope}
		if first, dup := seen[c]; dup {
			p.errorf(f.key, "two limits with algorithm %s, window %v and scope %s would share one counter (first at line %d)", c.alg, c.window, c.scope, first)
			continue
		}
		seen[c] = line(f.key)
		limits = append(limits, l)
		named = append(named, hasName)
	}
	for i, l := range limits {
		if !named[i] {
			l.Name = path
			if len(objs) > 1 {
				l.Name += "_" + l.Unit.String()
			}
		}
	}
	node.Add(limits...)
	p.limits = append(p.limits, limits...)
	p.named = append(p.named, named...)
	return limits
}

// rateLimit parses one rate_limit object. f.key is where messages point for
// the object as a whole.
func (p *parser) rateLimit(f field) (l *Limit, hasName, ok bool) {
	m := p.mapping(f.val, "rate_limit", []string{"unit", "unit_multiplier", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "scope", "fail_closed", "mitigation", "consistency"}, nil)
	if m == nil {
		return nil, false, false
	}
	errs := len(p.errs)
	l = &Limit{}
	l.Spec.Algorithm = p.opts.DefaultAlgorithm
	if g, ok := m["unlimited"]; ok {
		l.Unlimited, _ = p.boolean(g, "unlimited")
	}
	if g, ok := m["unit"]; ok {
		if s, ok := p.str(g, "unit"); ok {
			u, err := ParseUnit(s)
			switch {
			case err != nil && !l.Unlimited:
				p.errorf(g.val, "unit: %v", err)
			case err == nil && l.Unlimited:
				// As Envoy's ratelimit: a unit says the limit is not unlimited.
				p.errorf(g.val, "an unlimited limit takes no unit, got %q", s)
			}
			l.Unit = u
		}
	} else if !l.Unlimited {
		p.errorf(f.key, "rate_limit has no unit")
	}
	if g, ok := m["requests_per_unit"]; ok {
		if v, ok := p.integer(g, "requests_per_unit"); ok {
			switch {
			case v < 0:
				p.errorf(g.val, "requests_per_unit must be >= 0, got %d", v)
			case v > 0 && l.Unlimited:
				p.errorf(g.val, "requests_per_unit is %d but the limit is unlimited", v)
			}
			l.Spec.Limit = v
		}
	} else if !l.Unlimited {
		p.errorf(f.key, "rate_limit has no requests_per_unit (0 denies every request)")
	}
	if g, ok := m["unit_multiplier"]; ok {
		if v, ok := p.integer(g, "unit_multiplier"); ok {
			if v < 1 || time.Duration(v) > MaxWindow/l.Unit.Duration() {
				p.errorf(g.val, "unit_multiplier must be between 1 and %d for unit %s (a window of at most %v), got %d", int64(MaxWindow/l.Unit.Duration()), l.Unit, MaxWindow, v)
			}
			l.Multiplier = uint32(min(max(v, 0), math.MaxUint32))
		}
	}
	if g, ok := m["algorithm"]; ok {
		if s, ok := p.str(g, "algorithm"); ok {
			a, err := limit.ParseAlgorithm(s)
			if err != nil {
				p.errorf(g.val, "algorithm: %v", err)
			}
			l.Spec.Algorithm = a
		}
	}
	if g, ok := m["burst"]; ok {
		if v, ok := p.integer(g, "burst"); ok {
			switch {
			case l.Spec.Algorithm != limit.TokenBucket && l.Spec.Algorithm != limit.GCRA:
				p.errorf(g.key, "burst applies to token_bucket and gcra only, not to %s", l.Spec.Algorithm)
			case v < 0:
				p.errorf(g.val, "burst must be >= 0, got %d", v)
			}
			l.Spec.Burst = v
		}
	}
	if g, ok := m["scope"]; ok {
		if s, ok := p.str(g, "scope"); ok {
			sc, err := ParseScope(s)
			if err != nil {
				p.errorf(g.val, "scope: %v", err)
			}
			l.Scope = sc
			if sc != ScopePOP && !l.Spec.Algorithm.Replicable() {
				p.errorf(g.val, "scope %s counts across PoPs, which only sliding_window and fixed_window can (their per-window counts replicate as CRDT counters); %s is per-PoP only", sc, l.Spec.Algorithm)
			}
		}
	}
	if g, ok := m["consistency"]; ok {
		if s, ok := p.str(g, "consistency"); ok {
			c, err := limit.ParseConsistency(s)
			switch {
			case err != nil:
				p.errorf(g.val, "consistency: %v", err)
			case c != limit.Eventual && l.Scope == ScopePOP:
				p.errorf(g.key, "consistency applies to scope region or global limits: a pop-scoped limit is exact already")
			}
			l.Consistency = c
		}
	}
	hasName = p.nameAndFailClosed(m, l, "")
	if g, ok := m["replaces"]; ok {
		l.replaces = p.replaces(g, l.configured)
	}
	if g, ok := m["mitigation"]; ok {
		mm := p.mapping(g.val, "mitigation", []string{"duration"}, nil)
		if d, ok := mm["duration"]; ok {
			if s, ok := p.str(d, "mitigation.duration"); ok {
				dur, err := time.ParseDuration(s)
				switch {
				case err != nil:
					p.errorf(d.val, "mitigation.duration: %v (want e.g. 10m)", err)
				case dur <= 0:
					p.errorf(d.val, "mitigation.duration must be > 0, got %v", dur)
				}
				l.Mitigation = dur
			}
		} else {
			p.errorf(g.key, "mitigation needs a duration (e.g. {duration: 10m})")
		}
		if l.Scope == ScopePOP {
			p.errorf(g.key, "mitigation applies to scope region or global limits: a pop-scoped limit is already decided here")
		}
		if l.Consistency == limit.Bounded {
			// A bounded PoP denies when its own allowance is spent, which
			// says nothing of the limit as a whole: a ban would spread a
			// local shortfall to every PoP.
			p.errorf(g.key, "mitigation does not combine with consistency bounded (a PoP's spent allowance is not the limit crossed)")
		}
		if l.Consistency == limit.Strong {
			// The home decides every check; a denial made without it
			// (fail_closed, the share) is no sign the key is over.
			p.errorf(g.key, "mitigation does not combine with consistency strong (the key's home decides every check)")
		}
	}
	if len(p.errs) > errs {
		return nil, false, false
	}
	l.Spec.Window = int64(l.Window())
	if err := l.Spec.Validate(); err != nil {
		p.errorf(f.key, "rate_limit: %v", err)
		return nil, false, false
	}
	return l, hasName, true
}

// replaces parses a rate_limit's replaces: a list of {name: ...}, none of
// them empty or the limit's own name (self), as Envoy's ratelimit demands.
func (p *parser) replaces(f field, self string) []string {
	items, ok := p.list(f, "replaces")
	if !ok {
		return nil
	}
	var names []string
	for _, it := range items {
		m := p.mapping(it, "replaces entry", []string{"name"}, nil)
		if m == nil {
			continue
		}
		var name string
		if g, ok := m["name"]; ok {
			name, _ = p.str(g, "replaces name")
		}
		switch {
		case name == "":
			p.errorf(it, "replaces entry has no name; name the limit it replaces")
		case name == self:
			p.errorf(it, "replaces names the limit itself (%q)", name)
		default:
			names = append(names, name)
		}
	}
	return names
}

// nameAndFailClosed reads the name and fail_closed fields of a limit's
// mapping m into l (what prefixes the field names in messages, e.g.
// "concurrency."), and reports whether a name was configured.
func (p *parser) nameAndFailClosed(m map[string]field, l *Limit, what string) (hasName bool) {
	if g, ok := m["name"]; ok {
		if s, ok := p.str(g, what+"name"); ok && s != "" {
			if i := strings.IndexFunc(s, badNameRune); i >= 0 {
				p.errorf(g.val, "name %q: character %q is not allowed (want printable ASCII without \" or \\)", s, s[i])
			}
			l.Name, l.configured, hasName = s, s, true
		}
	}
	if g, ok := m["fail_closed"]; ok {
		l.FailClosed, _ = p.boolean(g, what+"fail_closed")
	}
	return hasName
}

// badNameRune reports a character that a policy name may not hold: it is
// reported in RateLimit-Policy as a structured-field string.
func badNameRune(r rune) bool { return r < 0x20 || r > 0x7e || r == '"' || r == '\\' }

// nameLimits makes the names of the file's limits unique: configured names
// are kept first, in file order; a repeated name gets "_2", "_3", … appended.
// Derived names (from the descriptor path, which holds request values) have
// characters a policy name may not hold replaced by '_'.
func (p *parser) nameLimits() {
	used := map[string]bool{}
	for _, configured := range []bool{true, false} {
		for i, l := range p.limits {
			if p.named[i] != configured {
				continue
			}
			name := l.Name
			if !configured {
				name = strings.Map(func(r rune) rune {
					if badNameRune(r) {
						return '_'
					}
					return r
				}, name)
			}
			if used[name] {
				base := name
				for k := 2; used[name]; k++ {
					name = base + "_" + strconv.Itoa(k)
				}
			}
			used[name] = true
			l.Name = name
		}
	}
}

// forwardAuth parses the forward_auth section.
func (p *parser) forwardAuth(f field) *ForwardAuth {
	m := p.mapping(f.val, "forward_auth", []string{"deny_status", "descriptors"}, nil)
	if m == nil {
		return nil
	}
	fa := &ForwardAuth{DenyStatus: 429}
	if g, ok := m["deny_status"]; ok {
		if v, ok := p.integer(g, "deny_status"); ok {
			if v < 400 || v > 499 {
				p.errorf(g.val, "deny_status must be a 4xx status such as 429 or 403, got %d", v)
			}
			fa.DenyStatus = int(v)
		}
	}
	g, ok := m["descriptors"]
	if !ok {
		p.errorf(f.key, "forward_auth has no descriptors")
		return nil
	}
	items, ok := p.list(g, "forward_auth descriptors")
	if ok && len(items) == 0 {
		p.errorf(g.key, "forward_auth descriptors must not be empty")
	}
	for _, it := range items {
		dm := p.mapping(it, "forward_auth descriptor", []string{"entries"}, nil)
		if dm == nil {
			continue
		}
		e, ok := dm["entries"]
		if !ok {
			p.errorf(it, "forward_auth descriptor has no entries")
			continue
		}
		entries, ok := p.list(e, "entries")
		if ok && len(entries) == 0 {
			p.errorf(e.key, "entries must not be empty")
		}
		var desc []AuthEntry
		for _, en := range entries {
			if ae, ok := p.authEntry(en); ok {
				desc = append(desc, ae)
			}
		}
		fa.Descriptors = append(fa.Descriptors, desc)
	}
	return fa
}

func (p *parser) authEntry(n *yaml.Node) (AuthEntry, bool) {
	var ae AuthEntry
	m := p.mapping(n, "forward_auth entry", []string{"key", "from", "value"}, nil)
	if m == nil {
		return ae, false
	}
	k, ok := m["key"]
	if !ok {
		p.errorf(n, "forward_auth entry has no key")
		return ae, false
	}
	if ae.Key, ok = p.str(k, "key"); !ok {
		return ae, false
	}
	if ae.Key == "" {
		p.errorf(k.val, "forward_auth entry key must not be empty")
		return ae, false
	}
	from, hasFrom := m["from"]
	value, hasValue := m["value"]
	switch {
	case hasFrom == hasValue:
		p.errorf(n, "forward_auth entry %q needs exactly one of from and value", ae.Key)
		return ae, false
	case hasValue:
		if ae.Value, ok = p.str(value, "value"); !ok {
			return ae, false
		}
		if ae.Value == "" {
			p.errorf(value.val, "forward_auth entry %q: value must not be empty", ae.Key)
			return ae, false
		}
	default:
		if ae.From, ok = p.str(from, "from"); !ok {
			return ae, false
		}
		h, isHeader := strings.CutPrefix(ae.From, "header:")
		if !slices.Contains(AuthSources, ae.From) && !(isHeader && isToken(h)) {
			p.errorf(from.val, "from %q: want one of %s or header:<Name>", ae.From, strings.Join(AuthSources, ", "))
			return ae, false
		}
	}
	return ae, true
}

// isToken reports whether s is a valid HTTP header name (RFC 9110 token).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// metadata parses a descriptor's metadata: a mapping of any JSON-like
// values (mappings with string keys, lists, strings, numbers, booleans,
// null), as Envoy's ratelimit returns it in dynamic metadata.
func (p *parser) metadata(f field) map[string]any {
	n := p.resolve(f.val)
	if n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(f.val, "metadata must be a mapping, got %s", kind(n))
		return nil
	}
	v, ok := p.metadataValue(n, 0)
	if !ok {
		return nil
	}
	return v.(map[string]any)
}

// metadataValue converts n into a JSON-like value, reporting what cannot be.
func (p *parser) metadataValue(n *yaml.Node, depth int) (any, bool) {
	at := n
	if n = p.resolve(n); n == nil || !p.spend(at) {
		return nil, false
	}
	if depth > maxDepth {
		p.errorf(at, "metadata nests deeper than %d levels", maxDepth)
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
				p.errorf(k, "metadata keys must be strings")
				return nil, false
			}
			v, ok := p.metadataValue(n.Content[i+1], depth+1)
			if !ok {
				return nil, false
			}
			m[k.Value] = v
		}
		return m, true
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, ok := p.metadataValue(c, depth+1)
			if !ok {
				return nil, false
			}
			l = append(l, v)
		}
		return l, true
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, true
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err == nil {
				return b, true
			}
		case "!!int", "!!float":
			var f float64
			if err := n.Decode(&f); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
				return f, true
			}
		default: // strings, and timestamps as written
			return n.Value, true
		}
	}
	p.errorf(at, "metadata holds a value that is not JSON-like (%s)", kind(n))
	return nil, false
}
