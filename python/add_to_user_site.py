"""Puts the package directory on /usr/bin/python3's path: a shardlab.pth file
in the user's site-packages naming it (python/shardlab finds the built
module in build/python by itself). Called by `make python`."""
import os
import site
import sys

package_dir = os.path.abspath(sys.argv[1])
if not site.ENABLE_USER_SITE:
    print(f"shardlab: user site-packages disabled: use PYTHONPATH={package_dir}")
    sys.exit(0)
user_site = site.getusersitepackages()
os.makedirs(user_site, exist_ok=True)
pth = os.path.join(user_site, "shardlab.pth")
with open(pth, "w") as f:
    f.write(package_dir + "\n")
print(f"shardlab: `import shardlab` now works for {sys.executable} ({pth} -> {package_dir})")
