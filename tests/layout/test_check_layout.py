#!/usr/bin/env python3
"""tools/check_layout.py must fail on what it says it catches: planted into a copy of the
repository's sources, an include that runs up a layer (data/ into train/, models/ into train/), a
folder grown past its limits, and an over-long file are each reported by path; the tree as it is
passes. Usage: test_check_layout.py REPO_ROOT (ctest `layout_checker`)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else '.')
CHECKER = os.path.join(ROOT, 'tools', 'check_layout.py')


def copy_tree(dest):
    # The sources the plants go into (the whole tree is checked by ctest `layout`).
    for top in ('src', 'tools'):
        shutil.copytree(os.path.join(ROOT, top), os.path.join(dest, top))


def run_checker(root):
    out = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
    return out.returncode, out.stdout


class CheckLayout(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix='layout-')
        copy_tree(self.dir)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def append(self, rel, text):
        with open(os.path.join(self.dir, rel), 'a', encoding='utf-8') as f:
            f.write(text)

    def test_the_tree_as_it_is_passes(self):
        code, out = run_checker(self.dir)
        self.assertEqual(code, 0, out)
        self.assertIn('0 layout problems', out)

    def test_an_include_from_data_into_train_fails(self):
        self.append('src/shardwise/data/loader.cc', '#include "shardwise/train/trainer.h"\n')
        code, out = run_checker(self.dir)
        self.assertEqual(code, 1)
        self.assertIn('src/shardwise/data/loader.cc', out)
        self.assertIn('layer data includes train/', out)

    def test_an_include_from_models_into_train_or_data_fails(self):
        self.append('src/shardwise/models/gpt.cc', '#include "shardwise/train/trainer.h"\n'
                    '#include "shardwise/data/loader.h"\n')
        code, out = run_checker(self.dir)
        self.assertEqual(code, 1)
        self.assertIn('layer models includes train/', out)
        self.assertIn('layer models includes data/', out)

    def test_a_crowded_folder_fails(self):
        folder = os.path.join(self.dir, 'src', 'shardwise', 'generate')
        for i in range(41):
            with open(os.path.join(folder, f'planted_{i}.h'), 'w', encoding='utf-8') as f:
                f.write('#pragma once\n')
        code, out = run_checker(self.dir)
        self.assertEqual(code, 1)
        self.assertRegex(out, r'src/shardwise/generate/: 4[5-9] source files')

    def test_a_folder_with_too_many_lines_fails(self):
        folder = os.path.join(self.dir, 'src', 'shardwise', 'data')
        for i in range(9):
            with open(os.path.join(folder, f'planted_{i}.h'), 'w', encoding='utf-8') as f:
                f.write('#pragma once\n' + '// filler\n' * 700)
        code, out = run_checker(self.dir)
        self.assertEqual(code, 1)
        self.assertRegex(out, r'src/shardwise/data/: \d+ source files, \d+ lines directly in it')

    def test_a_long_file_fails(self):
        self.append('src/shardwise/generate/sampling.cc', '// filler\n' * 800)
        code, out = run_checker(self.dir)
        self.assertEqual(code, 1)
        self.assertIn('src/shardwise/generate/sampling.cc:', out)


if __name__ == '__main__':
    unittest.main(argv=[sys.argv[0], '-v'])
