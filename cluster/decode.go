package cluster

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// ParseJobSpec reads a job spec from YAML (or JSON, which is YAML) and validates it. Every
// problem is reported at once in a *ValidationError, with its field path and line.
func ParseJobSpec(data []byte) (*JobSpec, error) {
	var j JobSpec
	if err := Decode(data, &j, "job spec"); err != nil {
		return nil, err
	}
	return &j, nil
}

// ParseTenant reads and validates a tenant record.
func ParseTenant(data []byte) (*Tenant, error) {
	var t Tenant
	if err := Decode(data, &t, "tenant"); err != nil {
		return nil, err
	}
	return &t, nil
}

// FormatJobSpec writes a spec as YAML that ParseJobSpec reads back to the same spec: what
// an operator edits to update a job (the console's spec editor).
func FormatJobSpec(spec JobSpec) ([]byte, error) {
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(spec); err != nil {
		return nil, fmt.Errorf("write job spec %s as YAML: %w", spec.Name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("write job spec %s as YAML: %w", spec.Name, err)
	}
	return []byte(b.String()), nil
}

// Locate gives the problems of err (a *ValidationError, found after Decode read data into a
// value of v's type: an update's checks against the running job) the lines of their fields
// in data, where they have none. Other errors are left alone.
func Locate(data []byte, v any, err error) {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return
	}
	_, idx, _, fe := index(data, v)
	if fe != nil {
		return
	}
	for i, p := range ve.Problems {
		if p.Line == 0 && p.Path != "" {
			ve.Problems[i].Line = idx.lineOf(p.Path)
		}
	}
}

// index parses data as YAML and walks it against v's type: the document, where each field
// path stands, and the unknown fields; or the document's one problem (a syntax error, an
// empty document).
func index(data []byte, v any) (*yaml.Node, *lineIndex, problems, *FieldError) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		fe := yamlSyntax(err)
		return nil, nil, nil, &fe
	}
	if root.Kind == 0 {
		return nil, nil, nil, &FieldError{Msg: "the document is empty"}
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	idx := newLineIndex()
	var ps problems
	checkFields(doc, reflect.TypeOf(v).Elem(), "", idx, &ps)
	return doc, idx, ps, nil
}

// validator is what Decode checks after decoding.
type validator interface{ Validate() error }

// Decode reads YAML or JSON into v strictly: unknown fields and wrong types are problems,
// not silently dropped. When v has a Validate method its problems join the list, each with
// the line it comes from. The error is a *ValidationError naming what was read.
func Decode(data []byte, v any, what string) error {
	doc, idx, ps, fe := index(data, v)
	if fe != nil {
		return &ValidationError{What: what, Problems: []FieldError{*fe}}
	}
	reported := map[string]bool{}
	for _, p := range ps {
		reported[p.Path] = true
	}
	if err := doc.Decode(v); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return &ValidationError{What: what, Problems: []FieldError{{Msg: err.Error()}}}
		}
		for _, msg := range te.Errors {
			fe := idx.typeError(msg)
			if !reported[fe.Path] || fe.Path == "" {
				ps = append(ps, fe)
				reported[fe.Path] = true
			}
		}
	}
	if val, ok := v.(validator); ok {
		if err := val.Validate(); err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				return err
			}
			for _, p := range ve.Problems {
				if reported[p.Path] {
					continue
				}
				p.Line = idx.lineOf(p.Path)
				ps = append(ps, p)
			}
		}
	}
	if len(ps) == 0 {
		return nil
	}
	// In source order, problems without a line (missing fields) last.
	slices.SortStableFunc(ps, func(a, b FieldError) int {
		switch {
		case a.Line == b.Line:
			return 0
		case a.Line == 0:
			return 1
		case b.Line == 0:
			return -1
		}
		return a.Line - b.Line
	})
	return &ValidationError{What: what, Problems: ps}
}

// The decoder's error texts, parsed for their line numbers; compiled when first needed, not
// at every process's start.
var lineRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(?:yaml: )?line (\d+)(?::(\d+))?: (.*)$`) })

func yamlSyntax(err error) FieldError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := lineRE().FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		// The decoder counts lines from 0 for its parser's errors (they all read "did not
		// find expected ..."), from 1 for its scanner's: where the unclosed [ or { or the
		// misplaced key stands is the line after the one it names.
		if strings.HasPrefix(m[3], "did not find expected") {
			line++
		}
		return FieldError{Msg: m[3], Line: line}
	}
	return FieldError{Msg: msg}
}

// lineIndex remembers where each field path stands in the source.
type lineIndex struct {
	pathLine map[string]int
	posPath  map[[2]int]string // (line, column) of a value -> its path
	linePath map[int]string    // line of a value -> the last path seen there
}

func newLineIndex() *lineIndex {
	return &lineIndex{pathLine: map[string]int{}, posPath: map[[2]int]string{}, linePath: map[int]string{}}
}

func (x *lineIndex) note(path string, key, val *yaml.Node) {
	line := val.Line
	if key != nil {
		line = key.Line
	}
	x.pathLine[path] = line
	x.posPath[[2]int{val.Line, val.Column}] = path
	x.linePath[val.Line] = path
}

// lineOf finds the line of path, or of its nearest parent that stands in the source.
func (x *lineIndex) lineOf(path string) int {
	for p := path; p != ""; {
		if l, ok := x.pathLine[p]; ok {
			return l
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

var posRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^line (\d+) col (\d+): (.*)$`) })
var unmarshalRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile("^cannot unmarshal !!(\\w+) `(.*)` into (.*)$") })

// typeError turns a decoder message ("line 3: cannot unmarshal ...") into a FieldError.
func (x *lineIndex) typeError(msg string) FieldError {
	if m := posRE().FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		col, _ := strconv.Atoi(m[2])
		return FieldError{Path: x.posPath[[2]int{line, col}], Msg: m[3], Line: line}
	}
	m := lineRE().FindStringSubmatch(msg)
	if m == nil {
		return FieldError{Msg: msg}
	}
	line, _ := strconv.Atoi(m[1])
	text := m[3]
	if u := unmarshalRE().FindStringSubmatch(text); u != nil {
		text = fmt.Sprintf("must be %s, not %s %q", friendlyType(u[3]), u[1], u[2])
	}
	return FieldError{Path: x.linePath[line], Msg: text, Line: line}
}

func friendlyType(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "a whole number"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map["):
		return "a mapping"
	default:
		return "a mapping"
	}
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// checkFields walks the source against the Go type, recording where each path stands and
// reporting keys the type does not have.
func checkFields(n *yaml.Node, t reflect.Type, path string, idx *lineIndex, ps *problems) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return
	}
	join := func(name string) string {
		if path == "" {
			return name
		}
		return path + "." + name
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return // the decoder reports the wrong type
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			f, ok := fieldByTag(t, k.Value)
			p := join(k.Value)
			if !ok {
				*ps = append(*ps, FieldError{Path: p, Msg: "unknown field", Line: k.Line})
				continue
			}
			idx.note(p, k, val)
			checkFields(val, f.Type, p, idx, ps)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, el := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			idx.note(p, nil, el)
			checkFields(el, t.Elem(), p, idx, ps)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := join(n.Content[i].Value)
			idx.note(p, n.Content[i], n.Content[i+1])
			checkFields(n.Content[i+1], t.Elem(), p, idx, ps)
		}
	}
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "-" {
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		if tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// posError reports a bad scalar so that Decode can name its field and keep decoding the rest.
func posError(n *yaml.Node, msg string) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d col %d: %s", n.Line, n.Column, msg)}}
}
