package deadletter

import (
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
)

// claimOwner is the process that holds a replay's claim on an entry,
// stored with the claim (field "claimBy"). A claim whose owner is known to
// be dead is taken over at once instead of when it expires: the owner ran
// on this machine, in this process's pid namespace (same machine key), and
// no process with its pid and start time runs any more. Elsewhere the claim
// lasts until its expiry (ClaimTTL after its last renewal).
type claimOwner struct {
	// Process is random, one per process.
	Process string `bson:"process"`
	// Host is the hostname, for people reading the entry.
	Host string `bson:"host,omitempty"`
	// Machine is the kernel's boot id and the pid namespace: processes
	// with the same Machine see each other's pids. Empty when unknown
	// (not Linux): such a claim is never judged dead before it expires.
	Machine string `bson:"machine,omitempty"`
	PID     int    `bson:"pid"`
	// Start is the process's start time (clock ticks after boot, field 22
	// of /proc/<pid>/stat), which tells a restarted pid from the owner.
	Start int64 `bson:"start,omitempty"`
}

// self is this process as a claim owner.
var self = sync.OnceValue(func() claimOwner {
	var b [8]byte
	_, _ = crand.Read(b[:])
	o := claimOwner{Process: hex.EncodeToString(b[:]), PID: os.Getpid()}
	o.Host, _ = os.Hostname()
	boot, err1 := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns, err2 := os.Readlink("/proc/self/ns/pid")
	start, err3 := procStart(o.PID)
	if err1 == nil && err2 == nil && err3 == nil {
		o.Machine = strings.TrimSpace(string(boot)) + "/" + ns
		o.Start = start
	}
	return o
})

// dead reports whether o, the owner of a claim, is known to have ended:
// another process than me, on my machine, whose pid no longer runs or now
// runs another process (another start time).
func (o claimOwner) dead(me claimOwner) bool {
	if o.Machine == "" || o.Machine != me.Machine || o.Process == me.Process || o.PID <= 0 {
		return false
	}
	start, err := procStart(o.PID)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && start != o.Start
}

// procStart returns the start time of process pid (field 22 of
// /proc/<pid>/stat, after the command name in parentheses).
func procStart(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): field 22 is f[19].
	if len(f) < 20 {
		return 0, errors.New("unexpected /proc stat format")
	}
	return strconv.ParseInt(f[19], 10, 64)
}
