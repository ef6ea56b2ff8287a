# The README's main-job demo: a short agent session under execgate's default rules.
# `execgate run` runs it in a fresh temp directory; every exec below is decided by the policy.
echo "== Run: a git workflow inside the sandbox"
git init -q -b main project && cd project
git config user.email agent@example.invalid && git config user.name agent
printf 'print("hello from the sandbox")\n' > app.py
git add app.py && git commit -qm "first commit" && git log --oneline
python3 app.py
echo "== Escalate: git clone needs the network; the default rules run it with network on"
git clone -q . ../clone && echo "cloned: $(git -C ../clone log --oneline)"
echo "== Deny: privilege tools are refused; the script sees status 1 and carries on"
su -c id root; echo "su exited with status $?"
chroot / true; echo "chroot exited with status $?"
echo "== done"
