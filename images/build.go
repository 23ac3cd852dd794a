package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"

	"github.com/stormdock/stormdock/isolation/shim"
)

// ErrBuild: the engine ran the build and it failed; the error carries the engine's message.
var ErrBuild = errors.New("image build failed")

// BuildOptions says what goes into a worker image.
type BuildOptions struct {
	// Tag names the image (repo:tag). Default DefaultTag.
	Tag string
	// Binary is the static stormdock binary, copied to StormdockPath. Default DefaultBinary().
	Binary string
	// Job is a job's own static binary, copied to JobPath; optional.
	Job string
	// Shim is the static stormdock-shim, copied to ShimPath. Default: the one beside Binary,
	// if there is one; an image without it runs, but an agent running from it (cluster
	// create) starts every process worker through the whole stormdock binary.
	Shim string
	// Labels are added to the image besides LabelManaged, LabelBinary and LabelShim.
	Labels map[string]string
	// Entrypoint and Cmd are the image's own command, which a docker job without a command
	// runs (under its lease launcher): say Cmd [/stormdock, worker, wordcount]. Default: no
	// entrypoint and the cmd [StormdockPath]. A job's command replaces both.
	Entrypoint, Cmd []string
}

// steps follow FROM and the labels. The user is the one the docker driver runs workers as
// when a spec names none; numeric, since a scratch image has no /etc/passwd.
const steps = `COPY stormdock ` + StormdockPath + `
%sUSER 65534:65534
`

// Build builds a worker image from an in-memory context and tags it.
func (m *Manager) Build(ctx context.Context, o BuildOptions) (Image, error) {
	if o.Tag == "" {
		o.Tag = DefaultTag
	}
	if o.Binary == "" {
		b, err := DefaultBinary()
		if err != nil {
			return Image{}, err
		}
		o.Binary = b
	}
	files := map[string]string{"stormdock": o.Binary}
	extra := ""
	if o.Job != "" {
		files["job"] = o.Job
		extra = "COPY job " + JobPath + "\n"
	}
	if o.Shim == "" {
		o.Shim, _ = shim.Beside(o.Binary)
	}
	labels := maps.Clone(o.Labels)
	if o.Shim != "" {
		files["stormdock-shim"] = o.Shim
		extra += "COPY stormdock-shim " + ShimPath + "\n"
		sum, err := fileSum(o.Shim)
		if err != nil {
			return Image{}, err
		}
		if labels == nil {
			labels = map[string]string{}
		}
		labels[LabelShim] = sum
	}
	for _, p := range files {
		if err := CheckStatic(p); err != nil {
			return Image{}, fmt.Errorf("%w: a FROM scratch image has no libc: build it with CGO_ENABLED=0", err)
		}
	}
	if o.Entrypoint == nil && o.Cmd == nil {
		o.Cmd = []string{StormdockPath}
	}
	df := fmt.Sprintf(steps, extra)
	for _, in := range []struct {
		name string
		args []string
	}{{"ENTRYPOINT", o.Entrypoint}, {"CMD", o.Cmd}} {
		if in.args != nil {
			b, err := json.Marshal(in.args) // the exec form: a JSON array, no shell
			if err != nil {
				return Image{}, fmt.Errorf("build image %s: %s: %w", o.Tag, in.name, err)
			}
			df += in.name + " " + string(b) + "\n"
		}
	}
	return m.build(ctx, df, files, o.Tag, labels)
}

// build sends FROM scratch, the labels and then steps to the engine with files as context,
// reads the build to its end and returns the tagged image.
func (m *Manager) build(ctx context.Context, steps string, files map[string]string, tag string, extra map[string]string) (Image, error) {
	sum, err := fileSum(files["stormdock"])
	if err != nil {
		return Image{}, err
	}
	labels := maps.Clone(extra)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManaged] = "true"
	labels[LabelBinary] = sum
	// Labels go into the Dockerfile right after FROM rather than into the build options, which
	// apply them at the end: so every intermediate image carries them too, and the layers a
	// failed build leaves behind are found and pruned like any stormdock image.
	var df strings.Builder
	df.WriteString("FROM scratch\n")
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		fmt.Fprintf(&df, "LABEL %s=%s\n", strconv.Quote(k), strconv.Quote(labels[k]))
	}
	df.WriteString(steps)
	tarball, err := buildContext(df.String(), files)
	if err != nil {
		return Image{}, err
	}
	resp, err := m.api.ImageBuild(ctx, tarball, build.ImageBuildOptions{
		Tags:        []string{tag},
		Remove:      true,
		ForceRemove: true,
		// The classic builder: the engine here (20.10, API 1.41) runs BuildKit only through a
		// session the plain API call does not open.
		Version: build.BuilderV1,
	})
	if err != nil {
		return Image{}, fmt.Errorf("build image %s: %w", tag, err)
	}
	id, err := readBuild(resp.Body)
	if err != nil {
		return Image{}, fmt.Errorf("build image %s: %w", tag, err)
	}
	imgs, err := m.api.ImageList(ctx, image.ListOptions{Filters: filters.NewArgs(filters.Arg("reference", tag))})
	if err != nil {
		return Image{}, fmt.Errorf("find built image %s: %w", tag, err)
	}
	for _, s := range imgs {
		if id == "" || s.ID == id {
			m.log.Info("image built", "tag", tag, "id", s.ID)
			return fromSummary(s), nil
		}
	}
	return Image{}, fmt.Errorf("build image %s: built %q but the engine does not list it", tag, id)
}

// buildContext makes the tar the engine builds from.
func buildContext(df string, files map[string]string) (io.Reader, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(df)), ModTime: now}); err != nil {
		return nil, err
	}
	if _, err := tw.Write([]byte(df)); err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		b, err := os.ReadFile(files[name])
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", files[name], err)
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(b)), ModTime: now}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &buf, nil
}

// fileSum is the hex sha256 of a file.
func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// buildMessage is one line of the engine's JSON build stream.
type buildMessage struct {
	Stream      string `json:"stream"`
	Error       string `json:"error"`
	ErrorDetail *struct {
		Message string `json:"message"`
	} `json:"errorDetail"`
	Aux *struct {
		ID string `json:"ID"`
	} `json:"aux"`
}

// readBuild reads the build stream to its end, always draining and closing it, and returns
// the image id or the build's error.
func readBuild(body io.ReadCloser) (string, error) {
	defer body.Close()
	defer io.Copy(io.Discard, body) //nolint:errcheck // draining only
	dec := json.NewDecoder(body)
	var id string
	var last []string // the last lines of output, to explain a failure
	for {
		var msg buildMessage
		if err := dec.Decode(&msg); err != nil {
			if errors.Is(err, io.EOF) {
				return id, nil
			}
			return "", fmt.Errorf("read build output: %w", err)
		}
		switch {
		case msg.ErrorDetail != nil || msg.Error != "":
			e := msg.Error
			if msg.ErrorDetail != nil && msg.ErrorDetail.Message != "" {
				e = msg.ErrorDetail.Message
			}
			return "", fmt.Errorf("%w: %s (after: %s)", ErrBuild, strings.TrimSpace(e), strings.Join(last, " | "))
		case msg.Aux != nil && msg.Aux.ID != "":
			id = msg.Aux.ID
		case strings.TrimSpace(msg.Stream) != "":
			last = append(last, strings.TrimSpace(msg.Stream))
			if len(last) > 3 {
				last = last[1:]
			}
		}
	}
}
