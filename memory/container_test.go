package memory

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const mountsV1 = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

func TestContainerLimit(t *testing.T) {
	tests := []struct {
		name      string
		files     map[string]string
		wantLimit int64
		wantFrom  string
	}{{
		name: "v1 nested, hybrid host",
		files: map[string]string{
			"proc/self/cgroup":                                       "8:pids:/\n4:memory:/outer/inner\n1:cpu:/\n0::/\n",
			"proc/self/mountinfo":                                    mountsV1,
			"sys/fs/cgroup/memory/memory.limit_in_bytes":             "9223372036854771712\n",
			"sys/fs/cgroup/memory/outer/memory.limit_in_bytes":       "1073741824\n",
			"sys/fs/cgroup/memory/outer/inner/memory.limit_in_bytes": "536870912\n",
		},
		wantLimit: 512 << 20, wantFrom: "/sys/fs/cgroup/memory/outer/inner/memory.limit_in_bytes",
	}, {
		name: "v1 parent is smaller",
		files: map[string]string{
			"proc/self/cgroup":    "4:memory:/outer/inner\n",
			"proc/self/mountinfo": mountsV1,
			"sys/fs/cgroup/memory/outer/memory.limit_in_bytes":       "268435456\n",
			"sys/fs/cgroup/memory/outer/inner/memory.limit_in_bytes": "9223372036854771712\n",
		},
		wantLimit: 256 << 20, wantFrom: "/sys/fs/cgroup/memory/outer/memory.limit_in_bytes",
	}, {
		name: "v1 unlimited",
		files: map[string]string{
			"proc/self/cgroup":                           "4:memory:/\n0::/\n",
			"proc/self/mountinfo":                        mountsV1,
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
		},
	}, {
		name: "v1 container without cgroup namespace: host path, mount root is the container's group",
		files: map[string]string{
			"proc/self/cgroup":                           "4:memory:/kubepods/pod1/abc\n",
			"proc/self/mountinfo":                        "35 31 0:32 /kubepods/pod1/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "536870912\n",
		},
		wantLimit: 512 << 20, wantFrom: "/sys/fs/cgroup/memory/memory.limit_in_bytes",
	}, {
		name: "v2 namespaced container",
		files: map[string]string{
			"proc/self/cgroup":               "0::/\n",
			"proc/self/mountinfo":            "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
			"sys/fs/cgroup/memory.max":       "536870912\n",
			"sys/fs/cgroup/memory.swap.max":  "0\n",
			"sys/fs/cgroup/cgroup.procs":     "1\n",
			"sys/fs/cgroup/cgroup.type":      "domain\n",
			"sys/fs/cgroup/memory.current":   "1\n",
			"sys/fs/cgroup/cgroup.max.depth": "max\n",
		},
		wantLimit: 512 << 20, wantFrom: "/sys/fs/cgroup/memory.max",
	}, {
		name: "v2 nested, max",
		files: map[string]string{
			"proc/self/cgroup":                                 "0::/system.slice/cg.service\n",
			"proc/self/mountinfo":                              "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
			"sys/fs/cgroup/system.slice/memory.max":            "max\n",
			"sys/fs/cgroup/system.slice/cg.service/memory.max": "1073741824\n",
		},
		wantLimit: 1 << 30, wantFrom: "/sys/fs/cgroup/system.slice/cg.service/memory.max",
	}, {
		name:  "no cgroup",
		files: map[string]string{"proc/self/mountinfo": ""},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := containerLimit(writeTree(t, tc.files))
			if got.Limit != tc.wantLimit || got.From != tc.wantFrom {
				t.Fatalf("got %+v, want %d from %q", got, tc.wantLimit, tc.wantFrom)
			}
		})
	}
}

func TestSize(t *testing.T) {
	c := Container{Limit: 512 << 20, From: "/sys/fs/cgroup/memory.max"}
	s := Size(0, "", c, "")
	if s.Budget != 128<<20 || !strings.Contains(s.BudgetFrom, "25% of the container memory limit 512 MiB (/sys/fs/cgroup/memory.max)") {
		t.Fatalf("%+v", s)
	}
	if s.GoMemLimit != 512<<20*9/10 {
		t.Fatalf("GOMEMLIMIT %d", s.GoMemLimit)
	}
	s = Size(64<<20, "c.toml:3", c, "300MiB")
	if s.Budget != 64<<20 || s.BudgetFrom != "max_in_flight_bytes at c.toml:3" || s.GoMemLimit != 0 || !strings.Contains(s.GoMemLimitFrom, "environment") {
		t.Fatalf("%+v", s)
	}
	s = Size(0, "", Container{}, "")
	if s.Budget != DefaultBudget || s.GoMemLimit != 0 {
		t.Fatalf("%+v", s)
	}
	if s := Size(0, "", Container{Limit: 2 << 20}, ""); s.Budget != MinBudget {
		t.Fatalf("tiny container: %+v", s)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{512: "512 B", 1 << 20: "1 MiB", 3 << 29: "1.5 GiB", 256 << 20: "256 MiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
