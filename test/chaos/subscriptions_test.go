package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/test/mongowire"
	"github.com/changegate/changegate/test/receiver"
)

const subsAdminToken = "subs-admin-token-0123456789"

// subChange is one write of the subscription test's writer: document doc
// set to seq, started at at.
type subChange struct {
	doc, seq int
	at       time.Time
}

// subRequest is one request the subscription's endpoint received.
type subRequest struct {
	header http.Header
	body   []byte
	at     time.Time
}

// subEndpoint records every request as it came, to verify the signatures
// afterwards with the reference Standard Webhooks library (it knows no
// secret: the secret is the API's answer).
type subEndpoint struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []subRequest
}

func newSubEndpoint(t *testing.T) *subEndpoint {
	s := &subEndpoint{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.reqs = append(s.reqs, subRequest{header: r.Header.Clone(), body: body, at: time.Now()})
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *subEndpoint) requests() []subRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// docSeq reads an envelope's document _id and seq (fullDocument of an
// insert, updatedFields of an update) and its id.
func docSeq(env []byte) (id string, doc, seq int, ok bool) {
	var e struct {
		ID          string `json:"id"`
		DocumentKey struct {
			ID *int `json:"_id"`
		} `json:"documentKey"`
		FullDocument *struct {
			Seq *int `json:"seq"`
		} `json:"fullDocument"`
		UpdateDescription *struct {
			UpdatedFields struct {
				Seq *int `json:"seq"`
			} `json:"updatedFields"`
		} `json:"updateDescription"`
	}
	if json.Unmarshal(env, &e) != nil || e.DocumentKey.ID == nil {
		return "", 0, 0, false
	}
	switch {
	case e.UpdateDescription != nil && e.UpdateDescription.UpdatedFields.Seq != nil:
		seq = *e.UpdateDescription.UpdatedFields.Seq
	case e.FullDocument != nil && e.FullDocument.Seq != nil:
		seq = *e.FullDocument.Seq
	default:
		return "", 0, 0, false
	}
	return e.ID, *e.DocumentKey.ID, seq, true
}

// firstSeen keeps the first delivery of each event id, in arrival order,
// and checks per-document order on them: a re-delivery may repeat changes,
// a change delivered for the first time must be later than every change
// of its document delivered before. It returns the (doc, seq) received.
func firstSeen(t *testing.T, what string, envs [][]byte) (map[[2]int]bool, int) {
	t.Helper()
	seen, got := map[string]bool{}, map[[2]int]bool{}
	last := map[int]int{}
	dups := 0
	for _, env := range envs {
		id, doc, seq, ok := docSeq(env)
		if !ok {
			t.Fatalf("%s: an envelope without a document _id and seq: %s", what, env)
		}
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		if l, ok := last[doc]; ok && seq <= l {
			t.Fatalf("%s: document %d: change %d delivered first after change %d (per-document order)", what, doc, seq, l)
		}
		last[doc] = seq
		got[[2]int{doc, seq}] = true
	}
	return got, dups
}

// subReplica is one changegate process of the subscription test.
type subReplica struct {
	name, admin, cfg string
	proc             *gatewayProc
}

// replicaStates returns each replica's /api/v1/status (or why there is
// none), and has each running one write a goroutine dump to the replicas'
// log (SIGQUIT ends it): for a test that failed.
func replicaStates(reps []*subReplica) string {
	var st strings.Builder
	for _, r := range reps {
		if r.proc == nil {
			fmt.Fprintf(&st, "\n%s: not running", r.name)
			continue
		}
		select {
		case <-r.proc.done:
			fmt.Fprintf(&st, "\n%s: exited: %v", r.name, r.proc.cmd.ProcessState)
			continue
		default:
		}
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + r.admin + "/api/v1/status")
		if err != nil {
			fmt.Fprintf(&st, "\n%s: %v", r.name, err)
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fmt.Fprintf(&st, "\n%s: %s", r.name, b)
		}
		_ = r.proc.cmd.Process.Signal(syscall.SIGQUIT)
	}
	time.Sleep(time.Second) // the dumps written
	return st.String()
}

// hookEnvelopes returns the envelopes hook received, in arrival order.
func hookEnvelopes(hook *receiver.Receiver) [][]byte {
	var envs [][]byte
	for _, d := range hook.Deliveries() {
		envs = append(envs, d.Envelope)
	}
	return envs
}

func subsAPI(t *testing.T, method, admin, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+subsAdminToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, out
}

// TestSubscriptionsTwoReplicas is issue 42's story with two real binaries
// in cluster mode (4 partitions) while a writer changes 20 documents
// continuously: a subscription created through one replica's API receives
// the changes written after its creation, signed with the returned secret
// (checked with the reference Standard Webhooks library); paused through
// the other replica, it receives nothing while changes are written;
// resumed, it receives them all, in per-document order; after rotation
// both the old and the new secret verify; deleted, nothing more arrives.
// A replica is killed (-9) and restarted while the subscription runs and
// the other while it is paused. The file's sink loses nothing and keeps
// per-document order throughout.
func TestSubscriptionsTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two binaries")
	}
	bin := changegateBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	// A replica killed in the middle of a parked write leaves its
	// transaction open, and the unit's next parked writes wait for MongoDB
	// to abort it (docs/cluster.md): 5 s here rather than the default 60 s,
	// so that the resume's re-drive is checked within seconds.
	srv, client, coll := watchedServer(ctx, t, mongowire.Options{TransactionLifetimeLimit: 5 * time.Second})
	hook := receiver.New(testSecret)
	t.Cleanup(hook.Close)
	sub := newSubEndpoint(t)

	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	env := []string{"TEST_SECRET=" + testSecret, "CHANGEGATE_SECRET_KEY=" + base64.StdEncoding.EncodeToString(key)}
	dir := t.TempDir()
	logFile, err := os.Create(filepath.Join(dir, "replicas.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				keep := filepath.Join(os.TempDir(), fmt.Sprintf("changegate-subscriptions-%d.log", time.Now().UnixNano()))
				if os.WriteFile(keep, b, 0o600) == nil {
					t.Logf("the replicas' log: %s", keep)
				}
			}
		}
	})
	reps := []*subReplica{{name: "cg-a"}, {name: "cg-b"}}
	for _, r := range reps {
		r.admin = freePort(t)
		r.cfg = filepath.Join(dir, r.name+".toml")
		text := strings.Replace(clusterConfig(srv.URI(), r.admin, hook.URL(), r.name), "public_read = true", "public_read = true\nadmin_token = \""+subsAdminToken+"\"", 1) + `
[subscriptions]
enabled = true
allow_private_networks = true
`
		if err := os.WriteFile(r.cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := func(r *subReplica) {
		t.Helper()
		p, err := startGateway(bin, r.cfg, env, logFile)
		if err != nil {
			t.Fatal(err)
		}
		r.proc = p
	}
	defer func() {
		for _, r := range reps {
			if r.proc != nil {
				r.proc.kill()
			}
		}
	}()
	for _, r := range reps {
		start(r)
	}
	// units counts the units the replicas run and those whose change
	// stream is open; ok is false when a replica did not answer.
	units := func() (owned, open int, ok bool) {
		for _, r := range reps {
			st, code, err := clusterStatusOf(r.admin)
			if err != nil || code != http.StatusOK {
				return 0, 0, false
			}
			owned, open = owned+len(st.active()), open+st.open()
		}
		return owned, open, true
	}
	unitsOwned := func() bool { owned, _, ok := units(); return ok && owned == 4 }
	// Before the first write, every unit's stream is open: with no
	// checkpoint yet, a unit starts at the moment its stream opens.
	streamsOpen := func() bool { owned, open, ok := units(); return ok && owned == 4 && open == 4 }
	if err := waitUntil(ctx, 60*time.Second, streamsOpen); err != nil {
		t.Fatalf("the 4 units were not taken and opened by the 2 replicas: %v (log %s)", err, logFile.Name())
	}
	kill := func(r *subReplica) {
		t.Helper()
		r.proc.kill()
		r.proc = nil
		time.Sleep(500 * time.Millisecond)
		start(r)
		if err := waitUntil(ctx, 30*time.Second, unitsOwned); err != nil {
			t.Fatalf("units not owned again after the SIGKILL of %s: %v", r.name, err)
		}
	}

	// The writer: 20 documents, then one update every 10 ms, round robin.
	const docs = 20
	var (
		wmu    sync.Mutex
		writes []subChange
	)
	for d := range docs {
		at := time.Now()
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: d}, {Key: "seq", Value: 0}}); err != nil {
			t.Fatal(err)
		}
		writes = append(writes, subChange{doc: d, seq: 0, at: at})
	}
	stopWriter := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		for i := docs; ; i++ {
			select {
			case <-stopWriter:
				writerDone <- nil
				return
			case <-time.After(10 * time.Millisecond):
			}
			c := subChange{doc: i % docs, seq: i / docs, at: time.Now()}
			if _, err := coll.UpdateByID(ctx, c.doc, bson.D{{Key: "$set", Value: bson.D{{Key: "seq", Value: c.seq}}}}); err != nil {
				writerDone <- err
				return
			}
			wmu.Lock()
			writes = append(writes, c)
			wmu.Unlock()
		}
	}()
	time.Sleep(time.Second)

	a, b := reps[0], reps[1]
	name := "team-a-items"
	_, created := subsAPI(t, "POST", a.admin, "/api/v1/subscriptions",
		fmt.Sprintf(`{"name":%q,"source":"items","sink":{"type":"webhook","url":%q}}`, name, sub.srv.URL))
	createdAt := time.Now()
	oldSecret, _ := created["secret"].(string)
	if !strings.HasPrefix(oldSecret, "whsec_") {
		t.Fatalf("created: %v, want a whsec_ secret", created)
	}
	if err := waitUntil(ctx, 10*time.Second, func() bool { return len(sub.requests()) > 0 }); err != nil {
		t.Fatalf("the subscription received nothing: %v", err)
	}
	time.Sleep(time.Second)
	kill(b) // while the subscription delivers
	time.Sleep(time.Second)

	subsAPI(t, "POST", b.admin, "/api/v1/subscriptions/"+name+"/pause", "")
	pausedAt := time.Now()
	time.Sleep(3 * time.Second) // applied by every replica within 2 s, then what was in flight
	beforePause := len(sub.requests())
	kill(a) // while it is paused
	time.Sleep(2 * time.Second)
	if n := len(sub.requests()); n != beforePause {
		t.Fatalf("the paused subscription received %d requests while changes were written", n-beforePause)
	}
	t.Logf("paused %v after the create; %d requests before the pause", pausedAt.Sub(createdAt).Round(time.Millisecond), beforePause)

	subsAPI(t, "POST", a.admin, "/api/v1/subscriptions/"+name+"/resume", "")
	resumedAt := time.Now()
	wmu.Lock()
	duringPause := 0
	for _, c := range writes {
		if c.at.After(pausedAt) && c.at.Before(resumedAt) {
			duringPause++
		}
	}
	wmu.Unlock()
	if err := waitUntil(ctx, 30*time.Second, func() bool { return len(sub.requests()) >= beforePause+duringPause }); err != nil {
		t.Fatalf("after the resume: %d requests, want at least %d: %v", len(sub.requests())-beforePause, duringPause, err)
	}
	// Resumed, every replica re-drives what it parked: nothing stays.
	parkedLeft := func() int64 {
		n, err := client.Database(stateDB).Collection("deadletters").CountDocuments(ctx, bson.D{{Key: "sink", Value: name}})
		if err != nil {
			return -1
		}
		return n
	}
	if err := waitUntil(ctx, 30*time.Second, func() bool { return parkedLeft() == 0 }); err != nil {
		t.Fatalf("%d entries of the subscription still parked 30 s after the resume: %v; replicas:%s", parkedLeft(), err, replicaStates(reps))
	}

	_, rotated := subsAPI(t, "POST", b.admin, "/api/v1/subscriptions/"+name+"/rotate-secret", "")
	rotatedAt := time.Now()
	newSecret, _ := rotated["secret"].(string)
	if !strings.HasPrefix(newSecret, "whsec_") || newSecret == oldSecret {
		t.Fatalf("rotated: %v, want a new whsec_ secret", rotated)
	}
	time.Sleep(4 * time.Second)

	subsAPI(t, "DELETE", a.admin, "/api/v1/subscriptions/"+name, "")
	deletedAt := time.Now()
	time.Sleep(3 * time.Second)
	afterDelete := len(sub.requests())
	time.Sleep(2 * time.Second)
	if n := len(sub.requests()); n != afterDelete {
		t.Fatalf("the deleted subscription received %d more requests", n-afterDelete)
	}

	close(stopWriter)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	wmu.Lock()
	all := slices.Clone(writes)
	wmu.Unlock()

	// The file's sink: every change, per-document order.
	if err := waitUntil(ctx, 60*time.Second, func() bool {
		ids := map[string]bool{}
		for _, d := range hook.Deliveries() {
			ids[d.ID] = true
		}
		return len(ids) >= len(all)
	}); err != nil {
		ids := map[string]bool{}
		for _, d := range hook.Deliveries() {
			ids[d.ID] = true
		}
		st := replicaStates(reps)
		got, _ := firstSeen(t, "hook", hookEnvelopes(hook))
		var missing []string
		for _, c := range all {
			if !got[[2]int{c.doc, c.seq}] {
				missing = append(missing, fmt.Sprintf("doc %d change %d (written %v after the delete)", c.doc, c.seq, c.at.Sub(deletedAt).Round(time.Millisecond)))
			}
		}
		t.Fatalf("the file's sink got %d of %d changes: %v; missing: %v; replicas:%s", len(ids), len(all), err, missing, st)
	}
	hookGot, hookDups := firstSeen(t, "hook", hookEnvelopes(hook))
	for _, c := range all {
		if !hookGot[[2]int{c.doc, c.seq}] {
			t.Fatalf("the file's sink lost document %d change %d", c.doc, c.seq)
		}
	}

	// The subscription: signatures, then every change from its creation
	// to a little before its deletion, in per-document order.
	oldWH, err := standardwebhooks.NewWebhook(oldSecret)
	if err != nil {
		t.Fatal(err)
	}
	newWH, err := standardwebhooks.NewWebhook(newSecret)
	if err != nil {
		t.Fatal(err)
	}
	var subEnvs [][]byte
	bothChecked := 0
	for i, r := range sub.requests() {
		if err := oldWH.VerifyIgnoringTimestamp(r.body, r.header); err != nil && r.at.Before(rotatedAt) {
			t.Fatalf("request %d (before the rotation) does not verify with the secret of the creation: %v\n%s", i, err, r.body)
		}
		if r.at.After(rotatedAt.Add(3 * time.Second)) {
			// Inside the overlap (24 h by default): both sign.
			if err := oldWH.VerifyIgnoringTimestamp(r.body, r.header); err != nil {
				t.Fatalf("request %d (after the rotation) does not verify with the old secret: %v", i, err)
			}
			if err := newWH.VerifyIgnoringTimestamp(r.body, r.header); err != nil {
				t.Fatalf("request %d (after the rotation) does not verify with the new secret: %v", i, err)
			}
			bothChecked++
		}
		if len(r.body) > 0 && r.body[0] == '[' {
			t.Fatalf("request %d: a batch, want one event per request", i)
		}
		subEnvs = append(subEnvs, bytes.Clone(r.body))
	}
	if bothChecked == 0 {
		t.Fatal("no request after the rotation: the overlap was not checked")
	}
	subGot, subDups := firstSeen(t, "subscription", subEnvs)
	wanted := 0
	for _, c := range all {
		if c.at.After(createdAt) && c.at.Before(deletedAt.Add(-2*time.Second)) {
			wanted++
			if !subGot[[2]int{c.doc, c.seq}] {
				// What the store still holds for the sink (a parked entry
				// no re-drive took is not lost, but not delivered either).
				var left []bson.M
				cur, err := client.Database(stateDB).Collection("deadletters").Find(ctx, bson.D{{Key: "sink", Value: name}})
				if err == nil {
					_ = cur.All(ctx, &left)
				}
				var kinds []string
				for _, d := range left {
					kinds = append(kinds, fmt.Sprintf("%v/%v/%v", d["kind"], d["unit"], d["documentKey"]))
				}
				t.Fatalf("the subscription lost document %d change %d (written %v after its creation, %v after the pause); the store holds %d entries of the sink: %v",
					c.doc, c.seq, c.at.Sub(createdAt).Round(time.Millisecond), c.at.Sub(pausedAt).Round(time.Millisecond), len(left), kinds)
			}
		}
	}
	t.Logf("%d changes written; the file's sink got them all (%d repeats, two SIGKILLs); the subscription got %d (%d repeats), %d checked with both secrets",
		len(all), hookDups, wanted, subDups, bothChecked)
}
