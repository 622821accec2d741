package app

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
)

const reloadBase = `
[mongo]
uri = "mongodb://db1:27017/?replicaSet=rs0"
state_database = "changegate"

[server]
listen = "127.0.0.1:9464"

[[sources]]
name = "orders"
database = "shop"
collection = "orders"

[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/hook"

[[rules]]
name = "all"
source = "orders"
sinks = ["hook"]
`

func parseConfig(t *testing.T, text string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("config.toml", []byte(text), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// TestReloadRefusesRestartOnlyChanges: a reload that changes [mongo],
// [[sources]] or server.listen, or reads an invalid file, is refused with
// ErrReloadRejected and a message naming what changed; the running
// configuration stays in force. The checks come before anything is built,
// so the gateway needs no engine here.
func TestReloadRefusesRestartOnlyChanges(t *testing.T) {
	cases := []struct {
		name     string
		edit     func(string) string
		problems []string // what the admin API reports
	}{{
		name:     "mongo.uri",
		edit:     func(s string) string { return strings.Replace(s, "db1:27017", "db2:27017", 1) },
		problems: []string{"[mongo] changed, which takes a restart"},
	}, {
		name: "mongo.state_database",
		edit: func(s string) string {
			return strings.Replace(s, `state_database = "changegate"`, `state_database = "other"`, 1)
		},
		problems: []string{"[mongo] changed, which takes a restart"},
	}, {
		name: "mongo.checkpoint_collection added",
		edit: func(s string) string {
			return strings.Replace(s, `state_database = "changegate"`, "state_database = \"changegate\"\ncheckpoint_collection = \"cps\"", 1)
		},
		problems: []string{"[mongo] changed, which takes a restart"},
	}, {
		name: "sources",
		edit: func(s string) string {
			return strings.Replace(s, `collection = "orders"`, `collection = "invoices"`, 1)
		},
		problems: []string{"[[sources]] changed, which takes a restart"},
	}, {
		name:     "server.listen",
		edit:     func(s string) string { return strings.Replace(s, "9464", "9465", 1) },
		problems: []string{"server.listen changed, which takes a restart"},
	}, {
		name: "mongo and listen together",
		edit: func(s string) string {
			return strings.Replace(strings.Replace(s, "db1:27017", "db2:27017", 1), "9464", "9465", 1)
		},
		problems: []string{"[mongo], server.listen changed, which takes a restart"},
	}, {
		name:     "invalid file",
		edit:     func(s string) string { return strings.Replace(s, `sinks = ["hook"]`, `sinks = ["hook-c"]`, 1) },
		problems: []string{`rules[0].sinks: unknown sink "hook-c" (did you mean "hook"?) at config.toml:22`},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cur := parseConfig(t, reloadBase)
			g := &gateway{log: slog.New(slog.DiscardHandler), loadConfig: func() (*config.Config, error) {
				return config.Parse("config.toml", []byte(tc.edit(reloadBase)), func(string) (string, bool) { return "", false })
			}}
			g.cfgPtr.Store(cur)
			err := g.Reload()
			if !errors.Is(err, ErrReloadRejected) {
				t.Fatalf("reload = %v, want ErrReloadRejected", err)
			}
			if got := api.Refusal(err); got.Error != ErrReloadRejected.Error() || !slices.Equal(got.Problems, tc.problems) {
				t.Fatalf("refusal %q, want %q and %q (error: %v)", got, ErrReloadRejected, tc.problems, err)
			}
			if g.Config() != cur {
				t.Fatal("a refused reload replaced the running configuration")
			}
		})
	}
}
