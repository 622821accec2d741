package memory

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Sizing defaults.
const (
	// MiB is a mebibyte.
	MiB = 1 << 20
	// DefaultBudget is max_in_flight_bytes without a container limit.
	DefaultBudget = 256 * MiB
	// MinBudget is the smallest max_in_flight_bytes accepted.
	MinBudget = 1 * MiB
	// BudgetPercent is the share of the container's memory limit that
	// max_in_flight_bytes defaults to. The rest is for what the budget does
	// not count: the MongoDB driver's read buffers (a getMore reply of up
	// to 16 MiB, and the wire message around it), HTTP and TLS buffers,
	// the Go runtime and the garbage the collector has not returned yet
	// (GOMEMLIMIT below makes it collect harder near the limit).
	BudgetPercent = 25
	// GoMemLimitPercent is the share of the container's memory limit set
	// as the Go runtime's soft memory limit (GOMEMLIMIT) when the
	// environment does not set one.
	GoMemLimitPercent = 90
)

// unlimitedV1 is at or above what cgroup v1 reports for "no limit"
// (PAGE_COUNTER_MAX pages, rounded: 9223372036854771712 on 4 KiB pages).
const unlimitedV1 = 1 << 62

// Container is the memory limit of the cgroup the process runs in.
type Container struct {
	// Limit is the limit in bytes; 0 when there is none.
	Limit int64
	// From is the file the limit was read from (empty when none).
	From string
}

// ContainerLimit reads the memory limit of the process's cgroup: cgroup v1
// memory.limit_in_bytes or cgroup v2 memory.max, the smallest along the
// cgroup's ancestors that are visible. It returns a zero Container when
// there is no limit or no cgroup file can be read.
func ContainerLimit() Container { return containerLimit("/") }

// containerLimit is ContainerLimit with /proc and the cgroup mounts under
// root (tests build a fake tree).
func containerLimit(root string) Container {
	groups, err := readProcCgroup(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return Container{}
	}
	mounts, err := readMounts(filepath.Join(root, "proc/self/mountinfo"))
	if err != nil {
		return Container{}
	}
	// cgroup v1 with a memory controller first (hybrid hosts mount an
	// empty v2 hierarchy beside it), then v2.
	if p, ok := groups.v1["memory"]; ok {
		for _, m := range mounts {
			if m.fstype == "cgroup" && m.hasOpt("memory") {
				if c := walkLimit(root, m, p, "memory.limit_in_bytes"); c.Limit > 0 {
					return c
				}
			}
		}
	}
	if groups.hasV2 {
		for _, m := range mounts {
			if m.fstype == "cgroup2" {
				if c := walkLimit(root, m, groups.v2, "memory.max"); c.Limit > 0 {
					return c
				}
			}
		}
	}
	return Container{}
}

type procGroups struct {
	v1    map[string]string // controller -> path
	v2    string
	hasV2 bool
}

// readProcCgroup parses /proc/self/cgroup: "id:controllers:path" lines, v2
// being "0::path".
func readProcCgroup(file string) (procGroups, error) {
	f, err := os.Open(file)
	if err != nil {
		return procGroups{}, err
	}
	defer f.Close()
	g := procGroups{v1: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			g.v2, g.hasV2 = parts[2], true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			g.v1[c] = parts[2]
		}
	}
	return g, sc.Err()
}

type mount struct {
	root, point, fstype string
	opts                []string
}

func (m mount) hasOpt(o string) bool {
	for _, x := range m.opts {
		if x == o {
			return true
		}
	}
	return false
}

// readMounts parses the cgroup mounts of /proc/self/mountinfo: "id parent
// major:minor root mountpoint options [optional...] - fstype source
// superoptions".
func readMounts(file string) ([]mount, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+4 {
			continue
		}
		fstype := fields[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		out = append(out, mount{root: fields[3], point: fields[4], fstype: fstype, opts: strings.Split(fields[sep+3], ",")})
	}
	return out, sc.Err()
}

// walkLimit reads file in the cgroup directory of cgPath under mount m and
// in its ancestors up to the mount point, and returns the smallest limit.
// A cgroup path outside the mount's root (a container without a cgroup
// namespace sees the host's path) is read at the mount point.
func walkLimit(root string, m mount, cgPath, file string) Container {
	rel := cgPath
	if m.root != "/" {
		if r, ok := strings.CutPrefix(cgPath, m.root); ok && (r == "" || r[0] == '/') {
			rel = r
		} else {
			rel = "/"
		}
	}
	rel = path.Clean("/" + rel)
	var best Container
	for {
		f := filepath.Join(m.point, rel, file)
		if n, ok := readLimitFile(filepath.Join(root, f)); ok && (best.Limit == 0 || n < best.Limit) {
			best = Container{Limit: n, From: f}
		}
		if rel == "/" {
			return best
		}
		rel = path.Dir(rel)
	}
}

// readLimitFile reads one limit file: a number of bytes, or "max" (v2) or
// a huge number (v1) for none.
func readLimitFile(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= unlimitedV1 {
		return 0, false
	}
	return n, true
}

// Sizing is the byte budget and Go memory limit that apply, and why.
type Sizing struct {
	// Budget is max_in_flight_bytes in bytes; BudgetFrom says where it
	// came from.
	Budget     int64
	BudgetFrom string
	// Container is the container's memory limit (zero when none).
	Container Container
	// GoMemLimit is the Go runtime's soft memory limit this process should
	// run with (0: leave it); GoMemLimitFrom says why.
	GoMemLimit     int64
	GoMemLimitFrom string
}

// Size computes the sizing: configured is max_in_flight_bytes from the
// configuration (0 when not set), at is where it was set (file:line);
// goMemLimitEnv is the GOMEMLIMIT environment variable ("" when unset).
func Size(configured int64, at string, c Container, goMemLimitEnv string) Sizing {
	s := Sizing{Container: c}
	switch {
	case configured > 0:
		s.Budget, s.BudgetFrom = configured, "max_in_flight_bytes at "+at
	case c.Limit > 0:
		s.Budget = max(c.Limit*BudgetPercent/100, MinBudget)
		s.BudgetFrom = fmt.Sprintf("%d%% of the container memory limit %s (%s)", BudgetPercent, FormatBytes(c.Limit), c.From)
	default:
		s.Budget, s.BudgetFrom = DefaultBudget, "default (no container memory limit found)"
	}
	switch {
	case goMemLimitEnv != "":
		s.GoMemLimitFrom = "GOMEMLIMIT=" + goMemLimitEnv + " from the environment"
	case c.Limit > 0:
		s.GoMemLimit = c.Limit * GoMemLimitPercent / 100
		s.GoMemLimitFrom = fmt.Sprintf("%d%% of the container memory limit", GoMemLimitPercent)
	default:
		s.GoMemLimitFrom = "none (no container memory limit, GOMEMLIMIT unset)"
	}
	return s
}

// Apply sets the Go runtime's soft memory limit when s has one. It returns
// the limit in force afterwards.
func (s Sizing) Apply() int64 {
	if s.GoMemLimit > 0 {
		debug.SetMemoryLimit(s.GoMemLimit)
	}
	return debug.SetMemoryLimit(-1)
}

// FormatBytes renders n in binary units ("512 MiB", "1.5 GiB").
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + string("KMGTP"[exp]) + "iB"
}
