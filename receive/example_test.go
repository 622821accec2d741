package receive_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/changegate/changegate/receive"
	"github.com/changegate/changegate/sinks/webhook"
)

// A webhook handler: verify, decode, deduplicate on the id.
func ExampleVerifier_Request() {
	v, err := receive.NewVerifier("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		msg, err := v.Request(r, 1<<20)
		if err != nil {
			http.Error(w, err.Error(), receive.StatusFor(err))
			return
		}
		envs, err := receive.DecodeBatch(msg.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // dead-lettered, not retried
			return
		}
		for _, env := range envs {
			state, _ := env.Updated("state")
			fmt.Printf("%s %s %s state=%s\n", msg.ID, env.OperationType, env.DocumentKey, state)
		}
	})

	// What changegate sends:
	body := `{"id":"jobs:8264F1","source":"jobs","operationType":"update","ns":{"db":"app","coll":"jobs"},` +
		`"documentKey":{"_id":"job-1"},"updateDescription":{"updatedFields":{"state":"step1"},"removedFields":[]},` +
		`"clusterTime":"2026-11-22T10:00:00Z","rules":["fork"]}`
	now := time.Now()
	sig, _ := webhook.Sign([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, "jobs:8264F1", now, []byte(body))
	req := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
	req.Header.Set("webhook-id", "jobs:8264F1")
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	handler.ServeHTTP(httptest.NewRecorder(), req)
	// Output: jobs:8264F1 update {"_id":"job-1"} state="step1"
}

// A Lambda fed by an SQS queue (via aws-lambda-go's events.SQSEvent, or
// this package's SQSEvent): each record's body is the envelope.
func ExampleFromSQSBody() {
	body := `{"id":"jobs:8264F1","source":"jobs","operationType":"insert","ns":{"db":"app","coll":"jobs"},` +
		`"documentKey":{"_id":"job-1"},"fullDocument":{"_id":"job-1","state":"pending"},"rules":["start"]}`
	env, err := receive.FromSQSBody(body)
	if err != nil {
		panic(err)
	}
	fmt.Println(env.ID, env.NS.Coll, string(env.FullDocument))
	// Output: jobs:8264F1 jobs {"_id":"job-1","state":"pending"}
}
