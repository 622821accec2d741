package config

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
)

// Defaults of optional keys.
const (
	DefaultStateDatabase        = "changegate"
	DefaultCheckpointCollection = "checkpoints"
	DefaultDeadLetterCollection = "deadletters"
	DefaultListen               = ":9464"
	DefaultShutdownGrace        = 30 * time.Second
	DefaultReadyMaxLag          = 30 * time.Second

	// MinMaxInFlightBytes is the smallest max_in_flight_bytes (1 MiB).
	MinMaxInFlightBytes = 1 << 20

	DefaultMaxAwait           = time.Second
	DefaultMaxInFlightEvents  = 10000
	DefaultCheckpointInterval = time.Second

	// MaxInFlightAuto is the max_in_flight value (and default) that makes
	// a sink's concurrency adaptive.
	MaxInFlightAuto           = "auto"
	DefaultSinkMaxInFlightMin = 1
	// DefaultSinkMaxInFlightMax is max_in_flight_max when it is not set:
	// 0, no count of its own. The adaptive limit's ceiling is then the
	// sources' max_in_flight_events (at most as many requests as events
	// in flight; what they hold is bounded by max_in_flight_bytes), shared
	// out within the process's open-file limit (see app).
	DefaultSinkMaxInFlightMax = 0
	// DefaultSinkCircuitMaxCooldown is the default circuit_max_cooldown:
	// the longest an open circuit waits before it probes the receiver
	// (the wait starts at 1s and doubles with every failed probe).
	DefaultSinkCircuitMaxCooldown = 10 * time.Second
	// MaxSinkCircuitMaxCooldown bounds circuit_max_cooldown.
	MaxSinkCircuitMaxCooldown = time.Hour
	DefaultParkAfter          = 30 * time.Second

	DefaultRetryMaxAttempts     = 8
	DefaultRetryInitialInterval = 500 * time.Millisecond
	DefaultRetryMaxInterval     = time.Minute
	DefaultRetryMaxElapsed      = 15 * time.Minute
	DefaultRetryMultiplier      = 2.0
	DefaultRetryJitter          = 0.2

	DefaultWebhookTimeout = 10 * time.Second
	// DefaultWebhookMaxRequestBytes is the default byte cap of a webhook
	// request body, batch or single event; MaxWebhookMaxRequestBytes the
	// largest accepted.
	DefaultWebhookMaxRequestBytes = 1 << 20
	MaxWebhookMaxRequestBytes     = 1 << 30
)

func (d *decoder) parse(data []byte) (*Config, error) {
	tree, se := parseTree(data)
	if se != nil {
		msg := "invalid TOML: " + se.msg
		return nil, d.errFrom(&Error{Msg: msg, File: d.file, Line: se.line, Column: se.column})
	}
	cfg, err := d.decodeTree(tree)
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// decodeTree decodes the schema from a parsed tree.
func (d *decoder) decodeTree(tree *table) (*Config, error) {
	cfg := &Config{File: d.file}
	root := d.obj("", &value{kind: kindTable, tbl: tree, line: 1})

	root.note("max_in_flight_bytes", func(k *Key) {
		k.Type, k.Range = "integer", fmt.Sprintf("%d (1 MiB) to the container's memory limit", MinMaxInFlightBytes)
	})
	if v := root.lookup("max_in_flight_bytes"); v != nil {
		if n := root.integer("max_in_flight_bytes", 0, math.MinInt64, math.MaxInt64); n != 0 || !root.bad["max_in_flight_bytes"] {
			if n < MinMaxInFlightBytes {
				d.errorf("max_in_flight_bytes", v.line, "must be at least %d (1 MiB), got %d", MinMaxInFlightBytes, n)
			} else {
				cfg.MaxInFlightBytes, cfg.MaxInFlightBytesLine = n, v.line
			}
		}
	}
	cfg.Mongo = d.mongo(root.section("mongo"))
	cfg.Server = d.server(root.section("server"))
	cfg.Cluster = d.cluster(root.section("cluster"), cfg.Mongo)
	cfg.DeliveryLog = d.deliveryLog(root.section("delivery_log"), cfg.Mongo, cfg.Cluster)
	sources := map[string]*value{}
	for _, o := range root.tables("sources") {
		s, nameVal := d.source(o, cfg.Mongo.StateDatabase)
		if nameVal != nil {
			if first, dup := sources[s.Name]; dup {
				d.errorf(o.keyPath("name"), nameVal.line, "duplicate source name %q (first defined at line %d)", s.Name, first.line)
			} else {
				sources[s.Name] = nameVal
			}
		}
		cfg.Sources = append(cfg.Sources, s)
	}
	sinks := map[string]*value{}
	for _, o := range root.tables("sinks") {
		s, nameVal := d.sink(o)
		if nameVal != nil {
			if first, dup := sinks[s.Name]; dup {
				d.errorf(o.keyPath("name"), nameVal.line, "duplicate sink name %q (first defined at line %d)", s.Name, first.line)
			} else {
				sinks[s.Name] = nameVal
			}
		}
		cfg.Sinks = append(cfg.Sinks, s)
	}
	rules := map[string]*value{}
	for _, o := range root.tables("rules") {
		r, nameVal := d.rule(o, cfg)
		if nameVal != nil {
			if first, dup := rules[r.Name]; dup {
				d.errorf(o.keyPath("name"), nameVal.line, "duplicate rule name %q (first defined at line %d)", r.Name, first.line)
			} else {
				rules[r.Name] = nameVal
			}
		}
		cfg.Rules = append(cfg.Rules, r)
	}
	cfg.Subscriptions = d.subscriptions(root.section("subscriptions"), cfg)
	root.done()
	if err := d.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (d *decoder) errFrom(e *Error) error {
	d.errs = append(d.errs, e)
	return d.err()
}

// section returns the table at k, or an empty table when it is absent, so
// that its required keys are reported as missing.
func (o *obj) section(k string) *obj {
	o.note(k, setType("table"))
	if o.t.get(k) == nil {
		o.lookup(k)
		return o.d.obj(k, &value{kind: kindTable, tbl: newTable()})
	}
	if s := o.sub(k); s != nil {
		return s
	}
	empty := o.d.obj(k, &value{kind: kindTable, tbl: newTable(), line: o.t.get(k).line})
	empty.noMissing = true // the type error says it all
	return empty
}

func (d *decoder) mongo(o *obj) Mongo {
	m := Mongo{}
	uri, v := o.secret("uri")
	switch {
	case v == nil:
		o.missing("uri")
	case o.bad["uri"]:
	case uri == "":
		d.errorf(o.keyPath("uri"), v.line, "must not be empty")
	case !strings.HasPrefix(string(uri), "mongodb://") && !strings.HasPrefix(string(uri), "mongodb+srv://"):
		d.errorf(o.keyPath("uri"), v.line, `must start with "mongodb://" or "mongodb+srv://"`)
	default:
		// Parse what can be parsed without the network (a mongodb+srv URI
		// needs DNS lookups), so check rejects what the driver would.
		if strings.HasPrefix(string(uri), "mongodb://") {
			if _, err := connstring.ParseAndValidate(string(uri)); err != nil {
				msg := err.Error()
				if strings.Contains(msg, "invalid password:") {
					// The driver quotes the bad escape, a piece of the secret.
					msg = "error parsing uri: invalid password: not a valid percent-encoding (the password is not shown)"
				}
				d.errorf(o.keyPath("uri"), v.line, "invalid connection string: %s", msg)
				break
			}
		}
		m.URI = uri
	}
	m.StateDatabase = o.dbName("state_database", DefaultStateDatabase)
	m.CheckpointCollection = o.collName("checkpoint_collection", DefaultCheckpointCollection)
	m.DeadLetterCollection = o.collName("deadletter_collection", DefaultDeadLetterCollection)
	if m.CheckpointCollection == m.DeadLetterCollection {
		d.errorf(o.keyPath("deadletter_collection"), o.lineOf("deadletter_collection"), "must differ from checkpoint_collection")
	}
	o.done()
	return m
}

// lineOf returns the line of key k, or of the table when k is absent.
func (o *obj) lineOf(k string) int {
	if v := o.t.get(k); v != nil {
		return v.line
	}
	return o.line
}

// dbName returns an optional database name at k.
func (o *obj) dbName(k, def string) string { return o.checkedName(k, def, checkDBName) }

// collName returns an optional collection name at k.
func (o *obj) collName(k, def string) string { return o.checkedName(k, def, checkCollName) }

// checkedName returns an optional name at k, reporting what check finds wrong with
// it (and returning def then).
func (o *obj) checkedName(k, def string, check func(string) string) string {
	o.note(k, func(key *Key) { key.Default = tomlString(def) })
	s, v, ok := o.str(k)
	if v == nil || !ok {
		return def
	}
	if msg := check(s); msg != "" {
		o.d.errorf(o.keyPath(k), v.line, "%s", msg)
		return def
	}
	return s
}

func checkDBName(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if i := strings.IndexAny(s, "/\\. \"$\x00"); i >= 0 {
		return fmt.Sprintf("invalid database name %q: it must not contain %q", s, s[i])
	}
	if len(s) > 63 {
		return fmt.Sprintf("invalid database name %q: longer than 63 bytes", s)
	}
	return ""
}

func checkCollName(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if i := strings.IndexAny(s, "$\x00"); i >= 0 {
		return fmt.Sprintf("invalid collection name %q: it must not contain %q", s, s[i])
	}
	return ""
}

// checkAllowedHost returns what is wrong with an allowed_hosts entry (lower
// case, trimmed), or "".
func checkAllowedHost(h string) string {
	switch {
	case h == "":
		return "must not be empty"
	case h == "*":
		return ""
	case strings.Contains(h, "://"):
		return fmt.Sprintf("%q: want a host name such as \"changegate.example.com\", without scheme", h)
	case strings.ContainsAny(h, "/ \t@?#*"):
		return fmt.Sprintf("%q is not a host name", h)
	}
	if _, _, err := net.SplitHostPort(h); err == nil {
		return fmt.Sprintf("%q: want a host name without port (any port is accepted)", h)
	}
	return ""
}

func (d *decoder) server(o *obj) Server {
	s := Server{Listen: DefaultListen}
	if l, v, ok := o.str("listen"); v != nil && ok {
		if l != "" {
			if _, port, err := net.SplitHostPort(l); err != nil || port == "" {
				d.errorf(o.keyPath("listen"), v.line, `invalid address %q: want "host:port" or ":port" (or "" to disable the server)`, l)
			} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
				d.errorf(o.keyPath("listen"), v.line, `invalid address %q: the port must be a number from 0 to 65535`, l)
			}
		}
		s.Listen = l
	}
	s.ShutdownGrace, _ = o.duration("shutdown_grace", DefaultShutdownGrace, 0)
	s.ReadyMaxLag, _ = o.duration("ready_max_lag", DefaultReadyMaxLag, time.Second)
	s.AdminToken, _ = o.secret("admin_token")
	if s.AdminToken != "" && strings.TrimSpace(s.AdminToken.Value()) == "" {
		d.errorf(o.keyPath("admin_token"), o.lineOf("admin_token"), "is only white space: set a real token, or leave it empty to disable mutating admin API calls")
	} else if n := len([]rune(s.AdminToken.Value())); s.AdminToken != "" && n < MinAdminTokenLength {
		d.errorf(o.keyPath("admin_token"), o.lineOf("admin_token"), "is %d characters, want at least %d (e.g. the output of openssl rand -hex 16)", n, MinAdminTokenLength)
	}
	s.PublicRead = o.boolean("public_read", false)
	if hosts, elems, v := o.strings("allowed_hosts"); v != nil && !o.bad["allowed_hosts"] {
		s.AllowedHosts = []string{}
		for i, h := range hosts {
			h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
			if msg := checkAllowedHost(h); msg != "" {
				d.errorf(indexPath(o.keyPath("allowed_hosts"), i), elems[i].line, "%s", msg)
				continue
			}
			s.AllowedHosts = append(s.AllowedHosts, h)
		}
	}
	s.Tokens = d.tokens(o, s.AdminToken)
	s.Console = o.boolean("console", true)
	s.ConsoleAuth = o.enum("console_auth", "", []string{ConsoleAuthNone, ConsoleAuthToken})
	if o.t.get("console_auth") == nil {
		// The console follows the API's read policy unless told otherwise.
		s.ConsoleAuth = s.ConsoleReadAuth()
	} else if s.ConsoleAuth == ConsoleAuthToken && s.AdminToken.Value() == "" && !o.bad["admin_token"] {
		d.errorf(o.keyPath("console_auth"), o.lineOf("console_auth"), `is "token" but server.admin_token is not set: set the token the console's pages then need, or console_auth = "none"`)
	}
	o.done()
	return s
}
