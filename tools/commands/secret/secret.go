// Package secret is `stormdock secret`: set, list and delete tenant secrets through a
// master's API, and make and rotate the masters' keyring file.
package secret

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/tools/commands"
)

// Command manages tenant secrets.
var Command = &cli.Command{
	Name:  "secret",
	Usage: "set, list and delete tenant secrets (delivered to workers as files, never shown back)",
	Subcommands: []*cli.Command{
		{
			Name: "set",
			Usage: "set a tenant's secret from a file (- reads stdin); setting it again makes a new version, " +
				"which running workers get live (their file rewritten, then SIGHUP)",
			ArgsUsage: "TENANT NAME --from-file FILE|-",
			Flags: append(commands.MasterFlags(),
				&cli.StringFlag{Name: "from-file", Usage: "`FILE` holding the value (at most 64 KiB), - for stdin (required)"}),
			Action: secretSet,
		},
		{
			Name:      "list",
			Usage:     "list secrets: names, versions, sizes, who set them and when (never values)",
			ArgsUsage: "[TENANT]",
			Flags:     append(commands.MasterFlags(), commands.OutputFlag),
			Action:    secretList,
		},
		{
			Name:      "delete",
			Usage:     "delete a tenant's secret (refused while a job names it)",
			ArgsUsage: "TENANT NAME",
			Flags:     commands.MasterFlags(),
			Action:    secretDelete,
		},
		{
			Name: "keygen",
			Usage: "add a new key at the head of the masters' keyring FILE (made, mode 0600, when missing): " +
				"it seals new secrets, the older keys still open theirs; give every master the same file",
			ArgsUsage: "FILE",
			Action:    secretKeygen,
		},
		{
			Name:   "rewrap",
			Usage:  "seal every secret again with the masters' active key, so that older keys can leave the keyring (admin)",
			Flags:  commands.MasterFlags(),
			Action: secretRewrap,
		},
	},
}

// tenantAndName checks the TENANT NAME arguments.
func tenantAndName(c *cli.Context) (string, string, error) {
	if err := commands.WantArgs(c, 2, "the TENANT and the secret NAME"); err != nil {
		return "", "", err
	}
	tenant, name := c.Args().Get(0), c.Args().Get(1)
	if err := cluster.CheckName(tenant); err != nil {
		return "", "", commands.UsageErr("the TENANT: %v", err)
	}
	if err := cluster.CheckSecretName(name); err != nil {
		return "", "", commands.UsageErr("the NAME: %v", err)
	}
	return tenant, name, nil
}

func secretSet(c *cli.Context) error {
	tenant, name, err := tenantAndName(c)
	if err != nil {
		return err
	}
	file := c.String("from-file")
	if file == "" {
		return commands.UsageErr("secret set needs --from-file FILE (- reads stdin): values never go on a command line")
	}
	var value []byte
	source := file
	if file == "-" {
		source = "stdin"
		value, err = io.ReadAll(io.LimitReader(c.App.Reader, cluster.MaxSecretBytes+1))
	} else {
		var f *os.File
		if f, err = os.Open(file); err == nil {
			value, err = io.ReadAll(io.LimitReader(f, cluster.MaxSecretBytes+1))
			f.Close()
		}
	}
	if err != nil {
		return commands.UsageErr("--from-file: %v", err)
	}
	defer clear(value)
	switch {
	case len(value) == 0:
		return commands.UsageErr("--from-file: %s is empty: a secret needs a value", source)
	case len(value) > cluster.MaxSecretBytes:
		return commands.UsageErr("--from-file: %s holds more than %d bytes, the most a secret may", source, cluster.MaxSecretBytes)
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	out, err := cl.SetSecret(c.Context, tenant, name, value)
	if err != nil {
		return commands.APIErr(c, err)
	}
	if !out.Changed {
		fmt.Fprintf(c.App.Writer, "secret %s of tenant %s: unchanged (version %d holds this value)\n", name, tenant, out.Version)
		return nil
	}
	fmt.Fprintf(c.App.Writer, "secret %s of tenant %s: version %d, %d bytes\n", name, tenant, out.Version, out.Size)
	return nil
}

func secretList(c *cli.Context) error {
	if c.NArg() > 1 {
		return commands.UsageErr("secret list takes at most a TENANT; got %d arguments", c.NArg())
	}
	tenant := c.Args().First()
	if tenant != "" {
		if err := cluster.CheckName(tenant); err != nil {
			return commands.UsageErr("the TENANT: %v", err)
		}
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	ss, err := cl.Secrets(c.Context, tenant)
	if err != nil {
		return commands.APIErr(c, err)
	}
	return commands.PrintOut(c, ss, func(w io.Writer) {
		fmt.Fprintln(w, "TENANT\tNAME\tVERSION\tSIZE\tUPDATED\tBY")
		for _, s := range ss {
			by := s.UpdatedBy
			if by == "" {
				by = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", commands.Clip(s.Tenant, 24), s.Name, s.Version, cluster.Bytes(s.Size),
				s.Updated.Local().Format(time.DateTime), by)
		}
	})
}

func secretDelete(c *cli.Context) error {
	tenant, name, err := tenantAndName(c)
	if err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	if err := cl.DeleteSecret(c.Context, tenant, name); err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "secret %s of tenant %s deleted\n", name, tenant)
	return nil
}

func secretKeygen(c *cli.Context) error {
	if err := commands.WantArgs(c, 1, "the keyring FILE"); err != nil {
		return err
	}
	file := c.Args().First()
	id, err := keyring.Generate(file)
	if err != nil {
		return commands.UsageErr("%v", err)
	}
	ring, err := keyring.Load(file)
	if err != nil {
		return commands.UsageErr("%v", err)
	}
	fmt.Fprintf(c.App.Writer, "key %s added to %s, which holds %d key(s): copy the file to every master (mode 0600), "+
		"then `stormdock secret rewrap` seals every secret with it\n", id, file, len(ring.IDs()))
	return nil
}

func secretRewrap(c *cli.Context) error {
	if err := commands.WantArgs(c, 0, "no arguments"); err != nil {
		return err
	}
	cl, err := commands.NewClient(c)
	if err != nil {
		return err
	}
	out, err := cl.RewrapSecrets(c.Context)
	if err != nil {
		return commands.APIErr(c, err)
	}
	fmt.Fprintf(c.App.Writer, "%d secret(s) sealed again with key %s; %d were already\n", out.Rewrapped, out.Key, out.Current)
	return nil
}
