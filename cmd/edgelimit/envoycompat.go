package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// envoySetting is one setting of Envoy's ratelimit that a flag of
// 'edgelimit pop' means too: with --envoy-compat, the peer's environment
// variable env sets the flag (through value, when it needs translating), and
// without the variable the flag takes the profile's value, if any. A flag
// set on the command line, by EDGELIMIT_<FLAG> or by --config wins over both.
type envoySetting struct {
	flag    string
	env     string // the peer's variable; "" for none
	profile string // the flag's value under the profile; "" leaves its default
	// value maps the variable's value to the flag's; nil takes it as it is.
	value func(v string) (string, error)
}

// envoySettings are the settings that differ from edgelimit's defaults
// under --envoy-compat, or that Envoy's ratelimit's environment sets.
var envoySettings = []envoySetting{
	{flag: "default-algorithm", profile: "fixed_window"},
	{flag: "count-denied-hits", env: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", profile: "true", value: func(v string) (string, error) {
		stop, err := strconv.ParseBool(v)
		return strconv.FormatBool(!stop), err
	}},
	{flag: "allow-empty-rules", profile: "true"},
	{flag: "headers", env: "LIMIT_RESPONSE_HEADERS_ENABLED", profile: "none", value: func(v string) (string, error) {
		on, err := strconv.ParseBool(v)
		if on {
			return "envoy", err
		}
		return "none", err
	}},
	{flag: "envoy-header-limit", env: "LIMIT_LIMIT_HEADER"},
	{flag: "envoy-header-remaining", env: "LIMIT_REMAINING_HEADER"},
	{flag: "envoy-header-reset", env: "LIMIT_RESET_HEADER"},
	{flag: "shadow-mode", env: "SHADOW_MODE"},
	{flag: "quota-mode", env: "QUOTA_MODE"},
	{flag: "response-dynamic-metadata", env: "RESPONSE_DYNAMIC_METADATA"},
	{flag: "merge-domains", env: "MERGE_DOMAIN_CONFIG"},
}

// applyEnvoyProfile gives the flags of fs that were not set explicitly the
// values of Envoy's ratelimit's profile and environment (envoySettings).
// Without the profile it only returns the peer's variables that are set, so
// that the caller can say they are not read.
func applyEnvoyProfile(fs *flag.FlagSet, on bool) (ignored []string, err error) {
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	for _, s := range envoySettings {
		v, fromEnv := "", false
		if s.env != "" {
			v, fromEnv = os.LookupEnv(s.env)
		}
		if !on {
			if fromEnv {
				ignored = append(ignored, s.env)
			}
			continue
		}
		if explicit[s.flag] {
			continue
		}
		switch {
		case fromEnv && s.value != nil:
			if v, err = s.value(v); err != nil {
				return nil, fmt.Errorf("environment %s=%q (Envoy's ratelimit's, read with --envoy-compat): want true or false", s.env, os.Getenv(s.env))
			}
		case fromEnv:
		case s.profile != "":
			v = s.profile
		default:
			continue
		}
		if err := fs.Set(s.flag, v); err != nil {
			if fromEnv {
				return nil, fmt.Errorf("environment %s=%q (Envoy's ratelimit's, read with --envoy-compat): %v", s.env, os.Getenv(s.env), err)
			}
			return nil, fmt.Errorf("--envoy-compat: --%s=%s: %v", s.flag, v, err)
		}
	}
	return ignored, nil
}

// headerName checks a response field name given by a flag.
func headerName(flagName, v string) error {
	if v == "" || strings.ContainsAny(v, " :\t\r\n") {
		return fmt.Errorf("--%s must be a header name, got %q", flagName, v)
	}
	return nil
}
