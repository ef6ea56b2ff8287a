"""Rules shared by the policy service tests, and the rules engine they run on."""

from execgate.policy_service import rules as rules_api

RULES = '''
[[rule]]
id = "echo-run"
program = "echo"
decision = "run"
justification = "echo is harmless"

[[rule]]
id = "env-escalate"
program = "env"
decision = "escalate"
justification = "env may print outside"
allow_env = ["LD_LIBRARY_PATH", "EXECGATE_KEEP_*"]

[[rule]]
id = "rm-deny"
program = "rm"
decision = "deny"
justification = "no deleting"

[[rule]]
id = "ls-prompt"
program = "ls"
decision = "prompt"
justification = "listing needs a look"
'''
